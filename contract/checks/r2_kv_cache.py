"""R2: bounded KV cache (MQA or GQA with ≤ 2 KV heads; ≤ 64 MiB at 4K context). Analytic."""

from __future__ import annotations

from aios.models import ModelHandle
from contract.checks.base import CheckContext, fmt_bytes
from contract.result import Evidence, Metric, RequirementResult, Status

ID, TITLE = "R2", "Bounded KV cache"


def kv_bytes(n_layers: int, n_kv_heads: int, head_dim: int, context: int, elem_bytes: int = 2) -> int:
    """K and V for every layer at ``context`` tokens: L × H_kv × d_head × C × 2 × elem_bytes."""
    return n_layers * n_kv_heads * head_dim * context * 2 * elem_bytes


def sliding_window(handle: ModelHandle) -> tuple[int, int]:
    """(window, number of layers that use it), or (0, 0): from a GGUF's keys (the window and the
    per-layer pattern, else the row's ``swa_pattern`` rule, as llama.cpp and aios-run read them)
    or an HF config (``layer_types`` when it lists them, else every layer: Mistral)."""
    if handle.kind == "gguf" and handle.store is not None:
        g = handle.arch.gguf_arch.lower()
        window = handle.store.field(f"{g}.attention.sliding_window")  # type: ignore[union-attr]
        if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
            return 0, 0
        pattern = handle.store.field(f"{g}.attention.sliding_window_pattern")  # type: ignore[union-attr]
        n, L = handle.arch.swa_pattern, handle.facts.n_layers
        n_local = (sum(bool(x) for x in pattern) if isinstance(pattern, list)
                   else sum(n == 0 or i % n < n - 1 for i in range(L)))
        return (window, n_local) if n_local else (0, 0)
    key = handle.arch.sliding_window_key
    window = handle.config.get(key) if key else None
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return 0, 0
    if handle.config.get("use_sliding_window") is False:  # Qwen2-style switch
        return 0, 0
    types = handle.config.get("layer_types")
    n_local = sum(t == "sliding_attention" for t in types) if isinstance(types, list) else handle.facts.n_layers
    return (window, n_local) if n_local else (0, 0)


def check(handle: ModelHandle, ctx: CheckContext) -> RequirementResult:
    spec = ctx.spec(ID)
    f = handle.facts
    c_spec = spec["context"]
    limit = spec["max_kv_bytes"]
    at_spec = kv_bytes(f.n_layers, f.n_kv_heads, f.head_dim, c_spec, spec["bytes_per_kv_element"])
    at_ctx = kv_bytes(f.n_layers, f.n_kv_heads, f.head_dim, ctx.context, spec["bytes_per_kv_element"])
    formula = (f"KV_bytes = L × H_kv × d_head × C × 4 = {f.n_layers} × {f.n_kv_heads} × {f.head_dim} × "
               f"{c_spec} × 4 = {at_spec:,} B ({fmt_bytes(at_spec)})")
    ok_heads = f.n_kv_heads <= spec["max_kv_heads"]
    ok_bytes = at_spec <= limit
    metrics = [
        Metric(name="kv_heads", value=f.n_kv_heads, evidence=Evidence.declared),
        Metric(name="attention_kind", value=f.attention_kind, evidence=Evidence.declared),
        Metric(name="kv_bytes_at_4096", value=at_spec, unit="B", evidence=Evidence.analytic),
        Metric(name="kv_mib_at_4096", value=round(at_spec / 2**20, 3), unit="MiB", evidence=Evidence.analytic),
        Metric(name="kv_bytes_per_token", value=at_spec // c_spec, unit="B", evidence=Evidence.analytic),
        Metric(name="kv_bytes_at_context", value=at_ctx, unit="B", evidence=Evidence.analytic,
               note=f"C = {ctx.context} (--context)"),
    ]
    max_ctx = f.max_context if isinstance(f.max_context, int) and f.max_context > 0 else None
    at_max = None
    if max_ctx is not None and max_ctx < c_spec:  # the contract's 4K is beyond what the model runs: show both
        at_max = kv_bytes(f.n_layers, f.n_kv_heads, f.head_dim, max_ctx, spec["bytes_per_kv_element"])
        metrics.append(Metric(name="kv_bytes_at_max_context", value=at_max, unit="B", evidence=Evidence.analytic,
                              note=f"C = {max_ctx}, the model's maximum context (declared)"))
    window, n_local = sliding_window(handle)
    if window:  # information only: the contract's formula counts every layer at the full context
        local = min(window, c_spec)
        actual = (kv_bytes(n_local, f.n_kv_heads, f.head_dim, local, spec["bytes_per_kv_element"])
                  + kv_bytes(f.n_layers - n_local, f.n_kv_heads, f.head_dim, c_spec, spec["bytes_per_kv_element"]))
        metrics.append(Metric(
            name="kv_bytes_at_4096_with_sliding_window", value=actual, unit="B", evidence=Evidence.analytic,
            note=(f"{n_local} of {f.n_layers} layers attend through a {window}-token window and keep at "
                  f"most {local} tokens; information only: the contract's formula (and its criterion) "
                  "counts every layer at the full context")))
    passed = ok_heads and ok_bytes
    if passed:
        summary = f"{f.attention_kind} with {f.n_kv_heads} KV head(s): {fmt_bytes(at_spec)} at 4K context (≤ 64 MiB)."
    else:
        parts = []
        if not ok_heads:
            parts.append(f"{f.n_kv_heads} KV heads ({f.attention_kind}; needs ≤ {spec['max_kv_heads']})")
        if not ok_bytes:
            parts.append(f"{fmt_bytes(at_spec)} at 4K context (needs ≤ 64 MiB)")
        summary = "KV cache not bounded: " + " and ".join(parts) + "."
    if at_max is not None:
        summary = (summary[:-1] + f"; the model's maximum context is {max_ctx} tokens "
                   f"({fmt_bytes(at_max)} there), the contract's criterion is at 4096.")
    return RequirementResult(
        id=ID, title=TITLE, status=Status.passed if passed else Status.failed,
        evidence=Evidence.analytic, metrics=metrics, formula=formula, summary=summary,
        criterion=f"MQA or GQA with ≤ {spec['max_kv_heads']} KV heads, and KV_bytes at C = {c_spec} ≤ 64 MiB (K and V, fp16)",
    )
