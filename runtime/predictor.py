"""Activation predictor for the FFN up projection (``--mode predict``, lossy).

Exact sparse execution (``--mode sparse``) skips the *down*-projection rows of zero
activations but must still compute every up (and gate) row to learn which ones are zero.
A predictor guesses the active set from the FFN input first, so only predicted rows of
up/gate are read — the approach of Deja Vu and PowerInfer, here as a low-rank linear map:

    ẑ = A (B h)        A: d_ffn × r, B: r × d_model       neuron j predicted active iff ẑ_j > τ_j

Fitting, per layer, from FFN inputs ``h`` collected by running the GGUF itself on
calibration text:
  1. whiten: C = HᵀH/n + εI = S Sᵀ (float64 Cholesky, ε grown until it succeeds);
  2. the best rank-r approximation of the pre-activation z = W h under that input
     distribution is the truncated SVD of W·S (scikit-learn ``randomized_svd``, seeded),
     giving A = U Σ and B = Vᵀ S⁻¹;
  3. per-neuron thresholds τ_j = the ``target_fnr`` quantile of ẑ_j over the calibration
     tokens where neuron j really fired, so each neuron misses about that fraction.
The false-negative rate (a firing neuron predicted silent, its contribution lost) is then
*measured* on a held-out split of the collected tokens and stored with the predictor, and
``aios-run bench`` measures it again on the tokens it decodes.

The predictor is a sidecar ``.npz`` (default ``<model>.predictor.npz``) so the GGUF stays
unchanged; it records the size and SHA-256 prefix of the GGUF it was fitted on and refuses
another file.

Fitting a whole GGUF runs the model, so ``fit`` lives above it in ``runtime.fit_predictor``;
this module never imports ``runtime.model`` (the model imports it to load a predictor).
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from aios.errors import InvalidModelError, UsageError

PREDICTOR_FORMAT = "aios-ffn-predictor/1"


@dataclass(frozen=True)
class PredictorConfig:
    rank: int = 32
    target_fnr: float = 0.01
    max_tokens: int = 4096  # calibration tokens collected (FFN inputs per layer)
    heldout_fraction: float = 0.2
    seed: int = 0


@dataclass
class LayerPredictor:
    A: np.ndarray  # (d_ffn, r) float32
    B: np.ndarray  # (r, d_model) float32
    tau: np.ndarray  # (d_ffn,) float32

    @property
    def nbytes(self) -> int:
        return self.A.nbytes + self.B.nbytes + self.tau.nbytes

    def predict(self, h: np.ndarray) -> np.ndarray:
        """Boolean (T, d_ffn): neurons predicted active for each row of ``h``."""
        return (h @ self.B.T) @ self.A.T > self.tau


@dataclass
class Predictor:
    layers: list[LayerPredictor]
    info: dict  # rank, target and measured held-out FNR, predicted density, source file

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.layers)


def file_fingerprint(path: Path) -> dict:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))  # header + first tensors: enough to tell files apart cheaply
    return {"name": path.name, "size": path.stat().st_size, "sha256_first_mib": h.hexdigest()}


def default_path(model_path: Path) -> Path:
    return model_path.with_suffix(".predictor.npz")


# --- fitting ---------------------------------------------------------------------------------


def _whitener(H: np.ndarray) -> np.ndarray:
    C = (H.T @ H) / max(1, len(H))
    d = C.shape[0]
    eps = 1e-6 * max(float(np.trace(C)) / d, 1e-12)
    for _ in range(12):
        try:
            return np.linalg.cholesky(C + eps * np.eye(d))
        except np.linalg.LinAlgError:
            eps *= 10
    return np.eye(d)  # degenerate inputs: fall back to plain SVD of W


def fit_layer(W: np.ndarray, H: np.ndarray, threshold: float | np.ndarray,
              cfg: PredictorConfig) -> LayerPredictor:
    """Fit one layer's predictor from its pre-activation weight W (d_ffn × d) and inputs H (n × d); a
    neuron fires above ``threshold`` (one number, or one per neuron: t - bias)."""
    from sklearn.utils.extmath import randomized_svd

    W64, H64 = W.astype(np.float64), H.astype(np.float64)
    S = _whitener(H64)
    r = min(cfg.rank, *W.shape)
    U, sig, Vt = randomized_svd(W64 @ S, n_components=r, n_iter=6, random_state=cfg.seed)
    A = U * sig
    B = np.linalg.solve(S.T, Vt.T).T  # Vᵀ S⁻¹
    Z = H64 @ W64.T  # true pre-activations (n, d_ffn)
    Zhat = (H64 @ B.T) @ A.T
    fired = Z > threshold
    tau = np.empty(W.shape[0])
    for j in range(W.shape[0]):
        s = Zhat[fired[:, j], j]
        # never fired in calibration: predict active only above every score seen
        tau[j] = np.quantile(s, cfg.target_fnr) - 1e-6 if len(s) else Zhat[:, j].max()
    return LayerPredictor(A.astype(np.float32), B.astype(np.float32), tau.astype(np.float32))


def evaluate(pred: LayerPredictor, W: np.ndarray, H: np.ndarray, threshold: float | np.ndarray) -> dict:
    fired = H @ W.T > threshold
    guess = pred.predict(H)
    n_fired = int(fired.sum())
    return {
        "tokens": len(H),
        "fired": n_fired,
        "false_negatives": int((fired & ~guess).sum()),
        "fnr": float((fired & ~guess).sum() / max(1, n_fired)),
        "true_density": float(fired.mean()),
        "predicted_density": float(guess.mean()),
    }


def collect_ffn_inputs(model, token_ids: list[list[int]], max_tokens: int, chunk: int = 512) -> list[np.ndarray]:
    """Per layer, the FFN inputs the runtime computes for ``token_ids`` (up to ``max_tokens``)."""
    per_layer: list[list[np.ndarray]] = [[] for _ in range(model.hp.n_layers)]
    seen = 0

    def hook(layer: int, h: np.ndarray) -> None:
        per_layer[layer].append(np.array(h, dtype=np.float32))

    model.ffn_input_hook = hook
    model.counter.enabled = False
    try:
        for ids in token_ids:
            if seen >= max_tokens:
                break
            ids = ids[: min(model.hp.n_ctx, max_tokens - seen)]
            model.reset()
            for c in range(0, len(ids), chunk):
                model.forward(ids[c : c + chunk])
            seen += len(ids)
    finally:
        model.ffn_input_hook = None
        model.counter.enabled = True
        model.reset()
    return [np.concatenate(x) if x else np.zeros((0, model.hp.d_model), np.float32) for x in per_layer]


# --- storage ---------------------------------------------------------------------------------


def save(pred: Predictor, out: str | Path) -> Path:
    import io

    from aios.io import write_atomic

    arrays = {"info": np.frombuffer(json.dumps(pred.info).encode(), dtype=np.uint8)}
    for i, p in enumerate(pred.layers):
        arrays[f"A{i}"], arrays[f"B{i}"], arrays[f"tau{i}"] = p.A, p.B, p.tau
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # arrays only; loading uses allow_pickle=False
    return write_atomic(Path(out), buf.getvalue())


def load(path: str | Path, model) -> Predictor:
    """Load a predictor sidecar and check it belongs to ``model`` (shapes and source file)."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"No predictor at {path}; fit one with: aios-run fit-predictor {model.path}")
    try:
        with np.load(path, allow_pickle=False) as z:
            info = json.loads(bytes(z["info"]).decode())
            layers = [LayerPredictor(np.asarray(z[f"A{i}"], np.float32), np.asarray(z[f"B{i}"], np.float32),
                                     np.asarray(z[f"tau{i}"], np.float32)) for i in range(model.hp.n_layers)]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:  # JSON/Unicode errors are ValueErrors
        raise InvalidModelError(f"{path} is not a readable predictor file ({e.__class__.__name__}).") from None
    if info.get("format") != PREDICTOR_FORMAT:
        raise InvalidModelError(f"{path} is not an {PREDICTOR_FORMAT} file.")
    hp = model.hp
    for i, p in enumerate(layers):
        r = p.A.shape[1] if p.A.ndim == 2 else -1
        if p.A.shape != (hp.d_ffn, r) or p.B.shape != (r, hp.d_model) or p.tau.shape != (hp.d_ffn,):
            raise InvalidModelError(f"{path} layer {i} does not match the model's shapes "
                                    f"(d_ffn {hp.d_ffn}, d_model {hp.d_model}).")
    src = info.get("source", {})
    fp = file_fingerprint(model.path)
    if src.get("size") != fp["size"] or src.get("sha256_first_mib") != fp["sha256_first_mib"]:
        raise InvalidModelError(f"{path} was fitted on {src.get('name', 'another file')}, not {model.path.name}; "
                                f"refit with: aios-run fit-predictor {model.path}")
    return Predictor(layers, info)
