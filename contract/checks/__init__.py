"""One module per contract requirement, each exposing ``check(model, ctx) -> RequirementResult``."""
