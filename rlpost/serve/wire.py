"""The Tinker API's messages: a forward-backward request in (protobuf), a sample
request's prompt and parameters in (JSON), the forward-backward output and a
sample's result out (protobuf).

The schema is the one the official ``tinker`` SDK ships (``tinker.proto.
tinker_public_pb2``, package ``tinker_public``): the server reads and writes the
very messages the client writes and reads. Token ids travel as little-endian int32
bytes, tensors as dense (or CSR) bytes with a dtype and a shape, and the per-datum
outputs as one batch of concatenated bytes with byte offsets.

Legend: n = tokens of one datum, k = targets per position (a top-k target).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rlpost.serve.errors import UserError


def _pb():  # imported on use: the SDK is the `serve` extra's
    from tinker.proto import tinker_public_pb2

    return tinker_public_pb2


@dataclass
class DatumIn:
    tokens: list[int]  # the model input, its chunks joined
    inputs: dict[str, np.ndarray]  # loss_fn_inputs: target_tokens (n,) or (n, k), weights, ...


@dataclass
class SampleParams:
    max_tokens: int
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    stop_strings: tuple[str, ...] = ()
    stop_tokens: tuple[int, ...] = ()
    seed: int | None = None


def prompt_tokens(prompt: dict) -> list[int]:
    """A sample request's ``prompt`` (a ``ModelInput``: chunks) as token ids; only
    text chunks are served."""
    tokens: list[int] = []
    for chunk in prompt.get("chunks", []):
        if not isinstance(chunk, dict) or chunk.get("type", "encoded_text") != "encoded_text":
            kind = chunk.get("type") if isinstance(chunk, dict) else type(chunk).__name__
            raise UserError(f"a prompt chunk of type {kind!r}; this server samples from text "
                            "chunks")  # fmt: skip
        ids = chunk.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise UserError("a prompt chunk's tokens must be a list of integers")
        tokens += ids
    return tokens


def sample_params(raw: dict, max_len: int) -> SampleParams:
    """The SDK's ``SamplingParams`` (JSON): ``stop`` is a string, strings or token ids;
    no ``max_tokens`` samples up to the model's ``max_len``."""
    stop = raw.get("stop")
    strings: tuple[str, ...] = ()
    tokens: tuple[int, ...] = ()
    if isinstance(stop, str):
        strings = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        strings = tuple(stop)
    elif isinstance(stop, list) and all(isinstance(s, int) for s in stop):
        tokens = tuple(stop)
    elif stop is not None:
        raise UserError("sampling_params.stop must be a string, strings or token ids")
    max_tokens = raw.get("max_tokens")
    if max_tokens is None:
        max_tokens = max_len
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise UserError(f"sampling_params.max_tokens={max_tokens!r}: a positive integer")
    seed = raw.get("seed")
    return SampleParams(
        max_tokens=max_tokens, temperature=float(raw.get("temperature", 1.0)),
        top_k=int(raw.get("top_k", -1)), top_p=float(raw.get("top_p", 1.0)),
        stop_strings=strings, stop_tokens=tokens,
        seed=None if seed is None else int(seed) % (1 << 62),
    )  # fmt: skip


@dataclass
class ForwardBackwardIn:
    model_id: str
    seq_id: int
    loss_fn: str
    config: dict[str, float | str]
    forward_only: bool
    data: list[DatumIn] = field(default_factory=list)


def _dtypes() -> dict[int, type]:
    pb = _pb()
    return {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64,
            pb.DTYPE_INT32: np.int32}  # fmt: skip


def tensor_array(tensor, where: str) -> np.ndarray:
    """A ``tinker_public.Tensor`` as an array (dense or CSR, zeros off the entries)."""
    dtypes = _dtypes()
    if tensor.dtype not in dtypes:
        raise UserError(f"{where}: tensor dtype {tensor.dtype} is not served "
                        "(float32, int64 and int32 are)")  # fmt: skip
    dtype, shape = dtypes[tensor.dtype], [int(s) for s in tensor.shape]
    if tensor.WhichOneof("encoding") == "sparse_csr":
        values: np.ndarray = np.frombuffer(tensor.sparse_csr.values, dtype)
        rows = np.frombuffer(tensor.sparse_csr.crow_indices, np.int64)
        cols = np.frombuffer(tensor.sparse_csr.col_indices, np.int64)
        if len(shape) != 2 or len(rows) != shape[0] + 1:
            raise UserError(f"{where}: a sparse tensor must be 2-D with rows + 1 row offsets")
        dense: np.ndarray = np.zeros(shape, dtype)
        for r in range(shape[0]):
            dense[r, cols[rows[r] : rows[r + 1]]] = values[rows[r] : rows[r + 1]]
        return dense
    flat: np.ndarray = np.frombuffer(tensor.dense, dtype)
    if not shape:
        return flat.copy()
    if int(np.prod(shape)) != flat.size:
        raise UserError(f"{where}: {flat.size} values do not fill the shape {shape}")
    return flat.reshape(shape).copy()


def decode_forward_backward(body: bytes, encoding: str | None = None) -> ForwardBackwardIn:
    """A ``ForwardBackwardRequest`` as the SDK sends it (zstd-compressed when the
    client was told to compress)."""
    pb = _pb()
    if encoding == "zstd":
        import zstandard

        body = zstandard.ZstdDecompressor().decompress(body)
    request = pb.ForwardBackwardRequest()
    try:
        request.ParseFromString(body)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise UserError(
            f"the forward_backward body is not a ForwardBackwardRequest ({exc})"
        ) from None
    config: dict[str, float | str] = dict(request.loss_fn_config)
    for key, value in request.loss_fn_config_v2.items():
        config[key] = value.number if value.WhichOneof("value") == "number" else value.text
    data = []
    for i, datum in enumerate(request.data):
        tokens: list[int] = []
        for chunk in datum.model_input:
            kind = chunk.WhichOneof("chunk")
            if kind != "encoded_text":
                raise UserError(f"data[{i}]: a {kind} chunk; this server trains on text chunks")
            tokens.extend(np.frombuffer(chunk.encoded_text.tokens, "<i4").tolist())
        inputs = {
            key: tensor_array(t, f"data[{i}].loss_fn_inputs[{key!r}]")
            for key, t in datum.loss_fn_inputs.items()
        }
        data.append(DatumIn(tokens, inputs))
    return ForwardBackwardIn(request.model_id, int(request.seq_id), request.loss_fn, config,
                             bool(request.forward_only), data)  # fmt: skip


def encode_forward_backward(outputs: list[np.ndarray], metrics: dict[str, float]) -> bytes:
    """A ``ForwardBackwardOutput``: each datum's ``logprobs`` (the targets' log-probs,
    shaped as its targets) and the metrics, keyed ``name:reduction``."""
    pb = _pb()
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    # One record per run of datums sharing a trailing shape ((n,) or (n, k)).
    groups: list[list[np.ndarray]] = []
    for array in outputs:
        if groups and groups[-1][0].shape[1:] == array.shape[1:]:
            groups[-1].append(array)
        else:
            groups.append([array])
    for group in groups:
        record = out.loss_fn_outputs.add()
        record.num_datums = len(group)
        field_ = record.fields["logprobs"]
        field_.dtype = pb.DTYPE_FLOAT32
        field_.trailing_shape.extend(list(group[0].shape[1:]))
        arrays = [np.ascontiguousarray(a, dtype="<f4") for a in group]
        field_.data = b"".join(a.tobytes() for a in arrays)
        field_.offsets = np.cumsum([0] + [a.nbytes for a in arrays], dtype="<i8").tobytes()
    for key, value in metrics.items():
        out.metrics[key] = float(value)
    return out.SerializeToString()


@dataclass
class SampledOut:
    tokens: list[int]  # never empty: the client reads empty log-probs as none
    logprobs: list[float]
    stopped: bool  # an end token or a stop sequence; False: max_tokens


def encode_sample(sequences: list[SampledOut], prompt_logprobs: list[float] | None) -> bytes:
    """A ``SampleResponse``: the sequences in the order of the acknowledged
    ``sample_sequence_ids``, and the prompt's log-probs when asked (NaN at 0)."""
    pb = _pb()
    out = pb.SampleResponse()
    for s in sequences:
        seq = out.sequences.add()
        seq.stop_reason = pb.STOP_REASON_STOP if s.stopped else pb.STOP_REASON_LENGTH
        seq.tokens = np.asarray(s.tokens, "<i4").tobytes()
        seq.logprobs = np.asarray(s.logprobs, "<f4").tobytes()
    if prompt_logprobs is not None:
        out.prompt_logprobs = np.asarray(prompt_logprobs, "<f4").tobytes()
    return out.SerializeToString()
