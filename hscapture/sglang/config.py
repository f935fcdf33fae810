"""Configuration of the SGLang adapter, from ``HSCAPTURE_*`` environment variables.

The scheduler processes SGLang spawns inherit the launcher's environment, so setting these
before ``python -m sglang.launch_server`` (or ``python -m hscapture.sglang``) configures
every rank. Nothing here imports SGLang.

=============================  ==========================================================
``HSCAPTURE_ENABLE``           ``1`` turns capture on (also implied by ``HSCAPTURE_ENDPOINT``)
``HSCAPTURE_ENDPOINT``         ZeroMQ endpoint the producer binds; may contain ``{dp_rank}``.
                               Without the placeholder, DP rank 0 binds it as given and DP
                               rank N>0 binds a derived one (see :func:`endpoint_for_dp_rank`).
                               Unset: ``ipc://<socket dir>/<producer id>.sock``, i.e. DP rank N
                               binds ``ipc://<socket dir>/sglang-dpN.sock`` (socket dir:
                               ``$HSCAPTURE_SOCKET_DIR``, else ``$XDG_RUNTIME_DIR/hscapture``,
                               else ``/tmp/hscapture-<uid>``; ``hscapture endpoints`` prints it).
``HSCAPTURE_PRODUCER_ID``      producer id prefix (default ``sglang``); the id is
                               ``<prefix>-dp<N>``; it also names the ring segment.
``HSCAPTURE_RID_PREFIX``       requests whose rid starts with this are captured
                               (default ``hscap-``; empty disables prefix opt-in)
``HSCAPTURE_PARAM``            ``sampling_params.custom_params[<this>]`` truthy opts a request
                               in (default ``hscapture``; empty disables)
``HSCAPTURE_LAYERS``           aux layer ids, e.g. ``2,16,29`` (default: SGLang's
                               ``--return-aux-hidden-state-layer-ids``; they must agree)
``HSCAPTURE_FINAL_NORM``       ``1`` (default) also captures ``last_hidden_states``
                               (post final norm) as ``final_norm``; ``0`` skips it
``HSCAPTURE_RING_BYTES``       ring capacity in bytes (default 1 GiB; suffixes K/M/G ok)
``HSCAPTURE_FULL_POLICY``      ``drop`` (default) or ``wait``
``HSCAPTURE_WAIT_TIMEOUT_S``   bound for the ``wait`` policy (default 0)
``HSCAPTURE_MODEL``            model name recorded in notices (default: SGLang's model path)
``HSCAPTURE_CONVENTION``       convention string recorded in every shard
                               (default ``sglang-eagle3-aux``)
=============================  ==========================================================
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Mapping

from ..errors import CaptureConfigError

__all__ = ["CaptureConfig", "load_config", "endpoint_for_dp_rank", "parse_layers"]

DEFAULT_RID_PREFIX = "hscap-"
DEFAULT_PARAM = "hscapture"
DEFAULT_CONVENTION = "sglang-eagle3-aux"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None:
        return default
    val = raw.strip().lower()
    if val in _TRUE:
        return True
    if val in _FALSE:
        return False
    raise CaptureConfigError(f"{name}: expected 0/1/true/false, found {raw!r}")


def _size(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    m = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)(i?[bB])?\s*", raw)
    if not m:
        raise CaptureConfigError(f"{name}: expected a byte count like 1073741824 or 1G, found {raw!r}")
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()]
    value = int(m.group(1)) * mult
    if value <= 0:
        raise CaptureConfigError(f"{name}: must be positive, found {raw!r}")
    return value


def parse_layers(raw: str | None) -> tuple[int, ...] | None:
    """``"2,16,29"`` / ``"2 16 29"`` → ``(2, 16, 29)`` (sorted: SGLang packs ascending)."""
    if raw is None or not raw.strip():
        return None
    try:
        layers = [int(x) for x in re.split(r"[,\s]+", raw.strip()) if x]
    except ValueError as exc:
        raise CaptureConfigError(f"HSCAPTURE_LAYERS: expected integers, found {raw!r}") from exc
    if not layers or any(x < 0 for x in layers) or len(set(layers)) != len(layers):
        raise CaptureConfigError(
            f"HSCAPTURE_LAYERS: expected distinct non-negative layer ids, found {raw!r}")
    return tuple(sorted(layers))


@dataclass(frozen=True)
class CaptureConfig:
    enabled: bool = False
    endpoint: str | None = None
    producer_id: str = "sglang"
    rid_prefix: str = DEFAULT_RID_PREFIX
    param: str = DEFAULT_PARAM
    layers: tuple[int, ...] | None = None
    final_norm: bool = True
    ring_bytes: int = 1 << 30
    full_policy: str = "drop"
    wait_timeout_s: float = 0.0
    model: str | None = None
    convention: str = DEFAULT_CONVENTION
    #: per-token fields a request may carry in ``custom_params`` (``hscapture_loss_mask``)
    fields: bool = True
    env: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    def fields_for(self, req: object, start: int, end: int) -> dict[str, bytes] | None:
        """The request's per-token fields for positions ``[start, end)``: a client sends
        ``sampling_params.custom_params.hscapture_loss_mask`` (one 0/1 per prompt token) and
        it travels with the sample. None when the request has none; a malformed mask is
        ignored here and reported by the sample missing its field (never a server error)."""
        sp = getattr(req, "sampling_params", None)
        custom = getattr(sp, "custom_params", None)
        if not isinstance(custom, dict):
            return None
        mask = custom.get(f"{DEFAULT_PARAM}_loss_mask")
        if not isinstance(mask, (list, bytes)) or len(mask) < end:
            return None
        try:
            return {"loss_mask": bytes(mask[start:end])}
        except (TypeError, ValueError):
            return None

    def wants(self, req: object) -> bool:
        """Did this request opt in? (rid prefix, or ``custom_params[param]`` truthy)."""
        rid = getattr(req, "rid", None)
        if self.rid_prefix and isinstance(rid, str) and rid.startswith(self.rid_prefix):
            return True
        if self.param:
            sp = getattr(req, "sampling_params", None)
            custom = getattr(sp, "custom_params", None)
            if isinstance(custom, dict) and custom.get(self.param):
                return True
        return False


def load_config(env: Mapping[str, str] | None = None) -> CaptureConfig:
    """Read the configuration; raises :class:`CaptureConfigError` on a malformed value."""
    env = dict(os.environ if env is None else env)
    endpoint = env.get("HSCAPTURE_ENDPOINT") or None
    enabled = _bool(env, "HSCAPTURE_ENABLE", endpoint is not None)
    policy = env.get("HSCAPTURE_FULL_POLICY", "drop").strip() or "drop"
    if policy not in ("drop", "wait"):
        raise CaptureConfigError(f"HSCAPTURE_FULL_POLICY: expected drop or wait, found {policy!r}")
    try:
        wait_s = float(env.get("HSCAPTURE_WAIT_TIMEOUT_S", "0") or 0)
    except ValueError as exc:
        raise CaptureConfigError("HSCAPTURE_WAIT_TIMEOUT_S: expected seconds") from exc
    producer_id = env.get("HSCAPTURE_PRODUCER_ID", "sglang").strip() or "sglang"
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", producer_id):
        raise CaptureConfigError(
            f"HSCAPTURE_PRODUCER_ID: expected [A-Za-z0-9_.-]+, found {producer_id!r}")
    return CaptureConfig(
        enabled=enabled,
        endpoint=endpoint,
        producer_id=producer_id,
        rid_prefix=env.get("HSCAPTURE_RID_PREFIX", DEFAULT_RID_PREFIX),
        param=env.get("HSCAPTURE_PARAM", DEFAULT_PARAM),
        layers=parse_layers(env.get("HSCAPTURE_LAYERS")),
        final_norm=_bool(env, "HSCAPTURE_FINAL_NORM", True),
        ring_bytes=_size(env, "HSCAPTURE_RING_BYTES", 1 << 30),
        full_policy=policy,
        wait_timeout_s=wait_s,
        model=env.get("HSCAPTURE_MODEL") or None,
        convention=env.get("HSCAPTURE_CONVENTION", DEFAULT_CONVENTION) or DEFAULT_CONVENTION,
        env=env,
    )


def endpoint_for_dp_rank(endpoint: str | None, dp_rank: int) -> str | None:
    """The endpoint DP rank ``dp_rank`` binds (None: the producer's default for its id).

    ``{dp_rank}`` in the template is replaced. Without it, rank 0 binds the endpoint as given;
    rank N>0 binds ``ipc://path-dpN[.sock]`` for ipc and ``tcp://host:(port+N)`` for tcp.
    """
    if endpoint is None:
        return None
    if "{dp_rank}" in endpoint:
        return endpoint.replace("{dp_rank}", str(dp_rank))
    if dp_rank == 0:
        return endpoint
    if endpoint.startswith("tcp://"):
        m = re.fullmatch(r"tcp://(.+):(\d+)", endpoint)
        if not m:
            raise CaptureConfigError(
                f"HSCAPTURE_ENDPOINT {endpoint!r}: a tcp endpoint needs an explicit port to "
                "derive one per DP rank (or use the {dp_rank} placeholder)")
        return f"tcp://{m.group(1)}:{int(m.group(2)) + dp_rank}"
    if endpoint.endswith(".sock"):
        return f"{endpoint[:-5]}-dp{dp_rank}.sock"
    return f"{endpoint}-dp{dp_rank}"
