"""``apply_chat_template`` for the runtime's own tokenizers (spm_tokenizer, light_tokenizer).

The call ``aios-run generate --chat`` makes (one conversation rendered to text) goes through
transformers' own renderer, ``render_jinja_template`` (its jinja2 sandbox, filters and globals,
the tokenizer's named special tokens as the template variables transformers passes), without
building the transformers tokenizer (~1.4 s and ~380 MB for a 262,144-token vocabulary). Any
other call (ids, batches, tools, extra template variables) goes to that tokenizer.
"""

from __future__ import annotations


def apply_chat_template(tok, conversation, *args, chat_template: str | None = None,
                        add_generation_prompt: bool = False, tokenize: bool = True, **kwargs):
    """``tok``: a tokenizer with ``chat_template``, ``special_tokens_map`` and ``full_tokenizer()``."""
    one = isinstance(conversation, (list, tuple)) and all(isinstance(m, dict) for m in conversation)
    if args or kwargs or tokenize or not one:
        return tok.full_tokenizer().apply_chat_template(
            conversation, *args, chat_template=chat_template, add_generation_prompt=add_generation_prompt,
            tokenize=tokenize, **kwargs)
    from transformers.utils.chat_template_utils import render_jinja_template

    template = chat_template or tok.chat_template
    if not template:
        raise ValueError("this tokenizer has no chat template (tokenizer.chat_template)")
    rendered, _ = render_jinja_template(conversations=[list(conversation)], chat_template=template,
                                        add_generation_prompt=add_generation_prompt, **tok.special_tokens_map)
    return rendered[0]
