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

``HSCAPTURE_PUBLISH_INTERVAL_MS`` (0 to 10000, default 20): the scheduler's thread announces
completed captures at most once per this many milliseconds (``0``: after every forward, at
~25 us more of its CPU per forward; why: ``hook.PUBLISH_INTERVAL_S``).

``HSCAPTURE_STAGE_INTERVAL_MS`` (0 to 10000, default 50): the captures of up to this many
milliseconds of forwards are written as one ring entry (``0``: one entry per forward; why:
``hook.STAGE_INTERVAL_S``). Samples are announced up to this much later.

Per request (``sampling_params.custom_params``; they travel with the sample):

- ``hscapture_loss_mask``: one 0/1 per prompt token, stored as the sample's ``loss_mask``
  field (:meth:`CaptureConfig.loss_mask_of`: any other is not stored, and the sample says
  why in ``extra["mask_error"]``);
- ``hscapture_meta``: small per-sample metadata (a dataset row id, a split), a flat map that
  obeys :func:`check_meta`; it reaches every reader as ``extra["meta"]``
  (:meth:`CaptureConfig.sample_extra`).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Union

from ..errors import CaptureConfigError, InvalidMetaError
from ..limits import MAX_WAIT_TIMEOUT_S
from ..record import I32

#: the largest byte count a size variable takes (HSCAPTURE_RING_BYTES): 1 TiB
MAX_BYTES = 1 << 40

__all__ = ["CaptureConfig", "load_config", "endpoint_for_dp_rank", "parse_layers",
           "check_meta", "META_PARAM", "MAX_META_KEYS", "MAX_META_KEY_CHARS",
           "MAX_META_BYTES", "MAX_META_ERROR_CHARS"]

DEFAULT_RID_PREFIX = "hscap-"
DEFAULT_PARAM = "hscapture"
DEFAULT_CONVENTION = "sglang-eagle3-aux"
#: the default of ``HSCAPTURE_PUBLISH_INTERVAL_MS`` (why 20 ms: ``hook.PUBLISH_INTERVAL_S``)
DEFAULT_PUBLISH_INTERVAL_MS = 20.0
#: the default of ``HSCAPTURE_STAGE_INTERVAL_MS`` (why: ``hook.STAGE_INTERVAL_S``)
DEFAULT_STAGE_INTERVAL_MS = 50.0
#: the default of ``HSCAPTURE_PASS_LOG_MS`` (``hook.PASS_LOG_INTERVAL_S`` says what it does):
#: 50 ms, on since the real server measured it (benchmarks/results/h200-2026-12-04)
DEFAULT_PASS_LOG_MS = 50.0

#: ``sampling_params.custom_params[META_PARAM]``: a request's per-sample metadata
META_PARAM = f"{DEFAULT_PARAM}_meta"
#: the meta rule's bounds (see :func:`check_meta`)
MAX_META_KEYS = 16
MAX_META_KEY_CHARS = 64
MAX_META_BYTES = 1024
#: ``extra["meta_error"]`` (why a request's meta was not kept) is at most this long
MAX_META_ERROR_CHARS = 300

#: a value :func:`check_meta` accepts
MetaValue = Union[str, int, float, bool, None]

_I64 = 1 << 63
_CONTROL = re.compile(r"[\x00-\x1f]")


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _exact_str(where: str, s: str) -> str:
    """``s`` as an exact, valid-Unicode ``str`` (a subclass is copied), else raise."""
    s = "".join((s,))
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidMetaError(f"{where}: expected valid Unicode, found a lone surrogate "
                                   f"at index {exc.start}") from None
    return s


def _meta_key(key: object) -> str:
    if not isinstance(key, str):
        raise InvalidMetaError(f"{META_PARAM}: expected str keys, found key {_show(key)} of "
                               f"type {type(key).__name__}")
    if not 0 < len(key) <= MAX_META_KEY_CHARS:
        raise InvalidMetaError(f"{META_PARAM}: expected keys of 1..{MAX_META_KEY_CHARS} "
                               f"characters, found {_show(key)} ({len(key)} characters)")
    key = _exact_str(f"{META_PARAM} key {_show(key)}", key)
    bad = _CONTROL.search(key)
    if bad is not None:
        raise InvalidMetaError(f"{META_PARAM} key {_show(key)}: expected no control "
                               f"characters, found U+{ord(bad.group()):04X}")
    return key


def _meta_value(key: str, v: object) -> MetaValue:
    where = f"{META_PARAM}[{_show(key)}]"
    if v is None:
        return None
    if isinstance(v, bool):
        return bool(v)
    if isinstance(v, int):
        v = int(v)
        if not -_I64 <= v < _I64:
            raise InvalidMetaError(f"{where}: expected an int in [-2**63, 2**63), found "
                                   f"{_show(v)}")
        return v
    if isinstance(v, float):
        v = float(v)
        if not math.isfinite(v):
            raise InvalidMetaError(f"{where}: expected a finite float, found {v!r}")
        return v
    if isinstance(v, str):
        if len(v) > MAX_META_BYTES:
            raise InvalidMetaError(f"{where}: expected the whole meta to encode in at most "
                                   f"{MAX_META_BYTES} bytes, found a {len(v)}-character string")
        return _exact_str(where, v)
    nested = " (values are not nested)" if isinstance(v, (Mapping, list, tuple)) else ""
    raise InvalidMetaError(f"{where}: expected str, int, float, bool or None, found "
                           f"{type(v).__name__}{nested}")


def check_meta(value: object) -> dict[str, MetaValue]:
    """Return ``value`` as a plain ``dict`` if it obeys the meta rule, else raise
    :class:`~hscapture.errors.InvalidMetaError` naming what was expected and what was found.

    The meta rule (its one definition; the SGLang hook applies it to
    ``custom_params.hscapture_meta``, a client may apply it before sending):

    * a map (``dict`` or any ``Mapping``) of at most :data:`MAX_META_KEYS` (16) entries;
    * every key a ``str`` of 1..:data:`MAX_META_KEY_CHARS` (64) characters, valid Unicode (no
      lone surrogate), without C0 control characters (U+0000..U+001F);
    * every value ``None``, a ``bool``, an ``int`` in ``[-2**63, 2**63)``, a finite ``float``
      or a valid-Unicode ``str``; nothing nested;
    * its compact JSON (``separators=(",", ":")``, non-ASCII kept, UTF-8) is at most
      :data:`MAX_META_BYTES` (1024) bytes.

    The result holds exact builtin types (subclasses such as ``numpy.float64`` are
    converted), keys in the given order; ``{}`` is valid (no metadata). Whatever it is given,
    it returns or raises :class:`InvalidMetaError`, nothing else.
    """
    if not isinstance(value, Mapping):
        raise InvalidMetaError(f"{META_PARAM}: expected a map of str to str/int/float/bool/None, "
                               f"found {type(value).__name__}")
    try:
        n = len(value)
        if n > MAX_META_KEYS:
            raise InvalidMetaError(f"{META_PARAM}: expected at most {MAX_META_KEYS} keys, "
                                   f"found {n}")
        out: dict[str, MetaValue] = {}
        for k, v in value.items():
            key = _meta_key(k)
            out[key] = _meta_value(key, v)
        if len(out) != n:   # str subclasses equal to another key collapsed into one
            raise InvalidMetaError(f"{META_PARAM}: expected distinct keys, found {n} keys "
                                   f"naming {len(out)}")
    except InvalidMetaError:
        raise
    except Exception as exc:  # a Mapping whose methods raise: not a usable meta either
        raise InvalidMetaError(f"{META_PARAM}: cannot read the map: {type(exc).__name__}") \
            from None
    size = len(json.dumps(out, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
    if size > MAX_META_BYTES:
        raise InvalidMetaError(f"{META_PARAM}: expected at most {MAX_META_BYTES} bytes of "
                               f"compact JSON, found {size}")
    return out

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
    if not 0 < value <= MAX_BYTES:
        raise CaptureConfigError(f"{name}: expected 1 byte to {MAX_BYTES >> 30} GiB, found "
                                 f"{raw!r}")
    return value


def step_bytes(raw: str, name: str) -> int:
    """The deferred copies' per-step budget ``raw`` (``48M``, ``64M``, ...; empty or ``0``:
    none, 0), by the one byte-count rule (:func:`_size`); ``name`` says where it came from in
    the :class:`CaptureConfigError` a malformed value raises."""
    if raw.strip() in ("", "0"):
        return 0
    return _size({name: raw}, name, 0)


def parse_layers(raw: str | None) -> tuple[int, ...] | None:
    """``"2,16,29"`` / ``"2 16 29"`` → ``(2, 16, 29)`` (sorted: SGLang packs ascending)."""
    if raw is None or not raw.strip():
        return None
    try:
        layers = [int(x) for x in re.split(r"[,\s]+", raw.strip()) if x]
    except ValueError as exc:
        raise CaptureConfigError(f"HSCAPTURE_LAYERS: expected integers, found {raw!r}") from exc
    if not layers or any(not 0 <= x < I32 for x in layers) or len(set(layers)) != len(layers):
        raise CaptureConfigError(
            f"HSCAPTURE_LAYERS: expected distinct layer ids from 0 to {I32 - 1}, found {raw!r}")
    return tuple(sorted(layers))


#: "not read yet": the ``custom`` default of CaptureConfig's per-request readers
_UNREAD: Any = object()


def custom_params(req: object) -> dict[str, Any] | None:
    """``req.sampling_params.custom_params`` when it is a dict (where a request's opt-in
    parameter, loss mask and meta travel), else None."""
    custom = getattr(getattr(req, "sampling_params", None), "custom_params", None)
    return custom if isinstance(custom, dict) else None


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
    #: the producer's ``publish_interval_s`` (``HSCAPTURE_PUBLISH_INTERVAL_MS`` / 1000)
    publish_interval_s: float = DEFAULT_PUBLISH_INTERVAL_MS / 1e3
    #: the producer's ``stage_interval_s`` (``HSCAPTURE_STAGE_INTERVAL_MS`` / 1000)
    stage_interval_s: float = DEFAULT_STAGE_INTERVAL_MS / 1e3
    #: how long the hook may hold a forward's captures before processing them
    #: (``HSCAPTURE_PASS_LOG_MS`` / 1000; 0: each forward at once)
    pass_log_interval_s: float = DEFAULT_PASS_LOG_MS / 1e3
    #: issue the captures' device-to-host copies at the next scheduling step, behind SGLang's
    #: own result read-back, not during the forward pass (``HSCAPTURE_DEFER_COPIES``; used
    #: only where the plugin's step hook is installed: ``Producer.defer_device_copies``)
    defer_copies: bool = True
    #: the deferred copies also wait for SGLang's read-back to COMPLETE (its ``copy_done``
    #: event), not only for the forward both wait on (``HSCAPTURE_COPIES_AFTER_READBACK``;
    #: off by default until a GPU run has measured it: docs/sglang.md)
    copies_after_readback: bool = False
    #: at most about this many bytes of the deferred copies issued per scheduling step, the
    #: rest at the next steps (``HSCAPTURE_COPY_STEP_BYTES``; 0: all at once;
    #: ``Producer.flush_device_copies``'s ``max_bytes``)
    copy_step_bytes: int = 0
    model: str | None = None
    convention: str = DEFAULT_CONVENTION
    #: per-token fields a request may carry in ``custom_params`` (``hscapture_loss_mask``)
    fields: bool = True
    #: per-sample metadata a request may carry in ``custom_params`` (``hscapture_meta``)
    meta: bool = True
    env: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    def loss_mask_of(self, req: object, tokens: int, *, custom: Any = _UNREAD
                     ) -> tuple[bytes | None, str | None]:
        """The request's loss mask for its ``tokens`` prompt tokens, checked once per sample:
        ``(mask, None)`` with one byte 0 or 1 per token; ``(None, None)`` when the request
        sends none (or fields are off); ``(None, why)`` when it breaks the rule (exactly one
        0 or 1 per prompt token, ``sampling_params.custom_params.hscapture_loss_mask``): the
        sample is then captured without it and says why (``extra["mask_error"]``). Never
        raises. Until 2026-12-05 each chunk took its slice unchecked: values 2 or 255 were
        stored as loss weights, a mask one too long was cut off by one without a word, and a
        short one left some chunks without a field, which cost the sample its mask silently.
        ``custom``: :func:`custom_params` of ``req``, where the caller read it already."""
        if custom is _UNREAD:
            custom = custom_params(req)
        if custom is None or not self.fields:
            return None, None
        raw = custom.get(f"{DEFAULT_PARAM}_loss_mask")
        if raw is None:
            return None, None
        rule = f"{DEFAULT_PARAM}_loss_mask: expected {tokens} values 0 or 1 (one per prompt token)"
        if not isinstance(raw, (list, tuple, bytes, bytearray)):
            return None, f"{rule}, found {type(raw).__name__}"
        try:
            mask = bytes(raw)
        except (TypeError, ValueError):
            bad = next((x for x in raw if type(x) not in (int, bool) or not 0 <= x <= 255),
                       None)
            return None, f"{rule}, found {bad!r:.40}"
        if len(mask) != tokens:
            return None, f"{rule}, found {len(mask)} values"
        rest = mask.translate(None, b"\x00\x01")
        if rest:
            return None, f"{rule}, found {rest[0]} at index {mask.index(rest[:1])}"
        return mask, None

    def meta_for(self, req: object, *, custom: Any = _UNREAD) -> dict[str, MetaValue] | None:
        """The request's per-sample metadata ``sampling_params.custom_params.hscapture_meta``
        as :func:`check_meta` returns it; None when it has none (absent, None or ``{}``).
        Raises :class:`~hscapture.errors.InvalidMetaError` when it breaks the meta rule.
        ``custom``: :func:`custom_params` of ``req``, where the caller read it already."""
        if custom is _UNREAD:
            custom = custom_params(req)
        if custom is None:
            return None
        raw = custom.get(META_PARAM)
        if raw is None:
            return None
        return check_meta(raw) or None

    def sample_extra(self, req: object, attempt: int = 0, *, custom: Any = _UNREAD
                     ) -> tuple[dict[str, Any], InvalidMetaError | None]:
        """The row ``extra`` of a new sample of ``req`` and the meta problem, if any.

        ``extra`` is ``{"attempt": attempt}``, plus ``"meta"`` (:meth:`meta_for`) when the
        request carries valid metadata, or ``"meta_error"`` (why it was not kept, at most
        :data:`MAX_META_ERROR_CHARS` characters) when it breaks the meta rule; the error is
        returned too, for the caller to count and log. Never raises: a bad meta never costs
        the sample, and the sample says why its meta is missing. Computed once per sample
        (its later chunks reuse the same map). ``custom``: as :meth:`meta_for` takes it."""
        extra: dict[str, Any] = {"attempt": attempt}
        if not self.meta or custom is None:
            return extra, None
        try:
            meta = self.meta_for(req, custom=custom)
        except InvalidMetaError as exc:
            extra["meta_error"] = str(exc)[:MAX_META_ERROR_CHARS]
            return extra, exc
        if meta:
            extra["meta"] = meta
        return extra, None

    def wants(self, req: object) -> bool:
        """Did this request opt in? (rid prefix, or ``custom_params[param]`` truthy)."""
        rid = getattr(req, "rid", None)
        if self.rid_prefix and isinstance(rid, str) and rid.startswith(self.rid_prefix):
            return True
        if self.param:
            custom = custom_params(req)
            if custom is not None and custom.get(self.param):
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
    raw_wait = env.get("HSCAPTURE_WAIT_TIMEOUT_S", "0") or "0"
    try:
        wait_s = float(raw_wait)
    except ValueError:
        wait_s = math.nan
    if not 0.0 <= wait_s <= MAX_WAIT_TIMEOUT_S:   # (nan fails too; inf hung the scheduler)
        raise CaptureConfigError(f"HSCAPTURE_WAIT_TIMEOUT_S: expected seconds from 0 to "
                                 f"{MAX_WAIT_TIMEOUT_S:g}, found {raw_wait!r}")
    interval_ms = _millis(env, "HSCAPTURE_PUBLISH_INTERVAL_MS", DEFAULT_PUBLISH_INTERVAL_MS)
    stage_ms = _millis(env, "HSCAPTURE_STAGE_INTERVAL_MS", DEFAULT_STAGE_INTERVAL_MS)
    log_ms = _millis(env, "HSCAPTURE_PASS_LOG_MS", DEFAULT_PASS_LOG_MS)
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
        defer_copies=_bool(env, "HSCAPTURE_DEFER_COPIES", True),
        copies_after_readback=_bool(env, "HSCAPTURE_COPIES_AFTER_READBACK", False),
        copy_step_bytes=step_bytes(env.get("HSCAPTURE_COPY_STEP_BYTES", ""),
                                   "HSCAPTURE_COPY_STEP_BYTES"),
        ring_bytes=_size(env, "HSCAPTURE_RING_BYTES", 1 << 30),
        full_policy=policy,
        wait_timeout_s=wait_s,
        publish_interval_s=interval_ms / 1e3,
        stage_interval_s=stage_ms / 1e3,
        pass_log_interval_s=log_ms / 1e3,
        model=_text(env, "HSCAPTURE_MODEL", None),
        convention=_text(env, "HSCAPTURE_CONVENTION", DEFAULT_CONVENTION),
        env=env,
    )


def _text(env: Mapping[str, str], name: str, default: str | None) -> str | None:
    """``env[name]`` (``default`` when unset or empty) if UTF-8 can encode it (every ring
    entry carries it); a byte the environment could not decode refuses the configuration
    (until 2026-12-05 the server started and every capture then failed)."""
    value = env.get(name) or default
    if value is not None:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise CaptureConfigError(f"{name}: expected UTF-8 text, found an undecodable "
                                     f"byte at index {exc.start} of {value[:60]!r}") from None
    return value


def _millis(env: Mapping[str, str], name: str, default: float) -> float:
    """Milliseconds from 0 to 10000 in ``env[name]`` (``default`` when unset or empty)."""
    text = env.get(name, "").strip()
    try:
        value = float(text) if text else default
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 10_000.0:   # (nan fails too)
        raise CaptureConfigError(f"{name}: expected milliseconds from 0 to 10000, found "
                                 f"{text!r}")
    return value


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
