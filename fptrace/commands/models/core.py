"""What `fptrace models` lists: the built-in configs and where their weights are."""

from __future__ import annotations

from fptrace.commands.models.result import ModelEntry
from fptrace.families import FAMILIES
from fptrace.models.registry import known_models


def _hub_cached(hub_id: str) -> bool:
    """True when the local HF cache holds safetensors weights of the repo (no network)."""
    try:
        from huggingface_hub import scan_cache_dir
    except ImportError:
        return False
    try:
        info = scan_cache_dir()
    except Exception:  # no cache folder yet, or an unreadable one
        return False
    for repo in info.repos:
        if repo.repo_id == hub_id and repo.repo_type == "model":
            return any(f.file_name.endswith(".safetensors")
                       for rev in repo.revisions for f in rev.files)
    return False


def list_models() -> list[ModelEntry]:
    fam_of = {t: f.name for f in FAMILIES for t in f.model_types}
    rows = []
    for alias, km in known_models().items():
        cfg = km.config
        if km.gguf:
            path = km.gguf_path()
            weights = (f"bundled ({km.gguf['package'].replace('_', '-')})" if path else
                       f"missing: {km.gguf['pip']}")
        else:
            weights = f"HF cache: {km.hub_id}" if _hub_cached(km.hub_id) else "config only"
        rows.append(ModelEntry(
            alias=alias,
            family=fam_of.get(cfg["model_type"], cfg["model_type"]),
            n_layers=cfg.get("num_hidden_layers", cfg.get("n_layer")),
            d_model=cfg.get("hidden_size", cfg.get("n_embd")),
            n_heads=cfg.get("num_attention_heads", cfg.get("n_head")),
            n_kv_heads=cfg.get("num_key_value_heads",
                               cfg.get("num_attention_heads", cfg.get("n_head"))),
            vocab_size=cfg["vocab_size"],
            context_length=cfg.get("max_position_embeddings", cfg.get("n_positions")),
            tokenizer=km.tokenizer,
            weights=weights,
            hub_id=km.hub_id,
            description=km.description,
            source=km.source,
        ))
    rows.sort(key=lambda r: (r.family, r.n_layers * r.d_model ** 2, r.alias))
    return rows
