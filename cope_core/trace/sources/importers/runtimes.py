"""Import the routing that serving runtimes record themselves: vLLM's returned routed experts and
SGLang's per-token expert-distribution dump (docs/traces.md cites the source of each format).

Both record every transformer block (``num_hidden_layers``), prompt tokens included. The import
keeps decode tokens only (prefill rows are counted in the report, never mixed in), keeps the
MoE blocks only (a model whose leading blocks are dense has ``dense_layers`` more rows), and
treats an id row that cannot be routing (a MoE block's all-zero row in vLLM, -1 in SGLang) as a
missing record: the prompt is cut at that token, as every importer here does, and the report
says so.

vLLM (``format="vllm"``)
    ``.jsonl`` files with one request per line, either a ``RequestOutput`` written as JSON
    (``prompt_token_ids``, ``outputs[i].token_ids``, ``outputs[i].routed_experts``) or an
    OpenAI-server response (``choices[i].routed_experts``, a base64 ``.npy`` string, with
    ``prompt_token_ids``/``token_ids`` from ``return_token_ids``). ``routed_experts`` covers
    positions ``start .. P + G - 2`` of a prompt of ``P`` tokens and ``G`` generated ones (the
    last token is never forwarded; ``start`` is the request's ``routed_experts_prompt_start``);
    the last ``G - 1`` rows are the decode tokens, decode token ``t`` at context ``P + t``.
    ``.npz`` files saved from a completion hold ``routed_experts`` and ``prompt_token_ids``
    (or ``num_prompt_tokens``); a bare ``.npy`` needs ``prompt_tokens``.
SGLang (``format="sglang"``)
    ``expert_distribution_recorder_*.pt`` files of ``--expert-distribution-recorder-mode
    per_token``: ``records`` of forward passes (``forward_mode`` 1 EXTEND, 2 DECODE, 3 MIXED,
    4 IDLE; ``positions``; ``topk_ids_of_layer`` ``[blocks, tokens, 8]``, -1 padded) and
    ``last_physical_to_logical_map``. Requests are not named in the dump, so it must be
    recorded one request at a time (``--max-running-requests 1``, ``--disable-radix-cache``):
    an EXTEND pass at position 0 starts a prompt, each DECODE pass is its next decode token with
    context = position. Physical ids are mapped to logical ones.
"""
from __future__ import annotations

import base64
import binascii
import io
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ....errors import CopeInputError
from ....geometry import ModelGeometry
from ...data import Trace
from .records import (
    Block,
    ImportReport,
    PromptReport,
    assemble,
    check_ids,
    existing_files,
    json_lines,
    prompt_block,
)

RUNTIME_FORMATS = ("vllm", "sglang")
_ORDER_NOTE = "the runtime records ids in its top-k kernel's order, not necessarily by score"


def _moe_blocks(ids: np.ndarray, g: ModelGeometry, src: str, where: str) -> np.ndarray:
    """``ids[tokens, blocks, k]`` cut to the model's MoE blocks ``[tokens, L, k]``."""
    blocks = ids.shape[1]
    if blocks == g.n_layers:
        return ids
    if blocks == g.dense_layers + g.n_layers:
        return ids[:, g.dense_layers:]
    raise CopeInputError(f"{where}: {blocks} layers, expected {g.n_layers} MoE layers"
                         + (f" or {g.dense_layers + g.n_layers} blocks with {g.dense_layers} "
                            "dense ones first" if g.dense_layers else "")
                         + f" for {g.name}", source=src, field="routed_experts")


def _decode_array(value: Any, src: str, where: str) -> np.ndarray:
    if isinstance(value, str):  # the OpenAI server's base64 of np.save bytes
        try:
            arr = np.load(io.BytesIO(base64.b64decode(value, validate=True)), allow_pickle=False)
        except (ValueError, OSError, binascii.Error) as exc:
            raise CopeInputError(f"{where}: not base64 .npy bytes ({' '.join(str(exc).split())})",
                                 source=src, field="routed_experts") from None
    else:
        try:
            arr = np.asarray(value)
        except (ValueError, TypeError):
            arr = np.zeros(0)
    if arr.ndim != 3 or arr.dtype.kind not in "iu":
        raise CopeInputError(f"{where}: got {arr.dtype} {arr.shape}, expected integers "
                             "[positions, layers, top_k]", source=src, field="routed_experts")
    return arr.astype(np.int64)


def _vllm_prompt(arr: np.ndarray, P: int | None, G: int | None, g: ModelGeometry, src: str,
                 where: str) -> tuple[np.ndarray, np.ndarray | None, int]:
    """Decode rows ``[T, L, k]`` (-1 = missing), their contexts (None if unknown), prefill rows."""
    if arr.shape[2] != g.top_k:
        raise CopeInputError(f"{where}: {arr.shape[2]} ids per row, expected top_k = {g.top_k} "
                             f"for {g.name}", source=src, field="routed_experts")
    R = arr.shape[0]
    if G is not None:
        n_dec = G - 1
        if n_dec < 0 or R < n_dec or (P is not None and R > P + G - 1):
            raise CopeInputError(f"{where}: {R} rows for {P if P is not None else '?'} prompt "
                                 f"and {G} generated tokens, expected between {n_dec} and "
                                 f"{'P + G - 1' if P is None else P + G - 1} (positions up to "
                                 "the last forwarded token)", source=src, field="routed_experts")
    elif P is not None:
        if R < P:
            raise CopeInputError(f"{where}: {R} rows, fewer than the {P} prompt tokens",
                                 source=src, field="routed_experts")
        n_dec = R - P
    else:
        raise CopeInputError(f"{where}: cannot tell prefill from decode rows without the "
                             "prompt or generated token ids (request with return_token_ids, "
                             "or pass the prompt length)", source=src, field="prompt_token_ids")
    dec = _moe_blocks(arr[R - n_dec:], g, src, where)
    if g.top_k > 1:
        # ids are distinct in real routing: an all-zero row is the capture buffer's blank
        dec = np.where((dec == 0).all(axis=2, keepdims=True), -1, dec)
    check_ids(dec, g, src, where)
    ctx = None if P is None else P + np.arange(n_dec)
    return dec, ctx, R - n_dec


def _ids_list(v: Any, src: str, where: str, name: str) -> int | None:
    if v is None:
        return None
    if not isinstance(v, list):
        raise CopeInputError(f"{where}: got {v!r:.40}, expected a list of token ids", source=src,
                             field=name)
    return len(v)


def _vllm_lines(src: str) -> list[tuple[str, Any, int | None, int | None]]:
    """(label, routed_experts, P, G) per completion of a JSON-lines file."""
    out = []
    for i, obj in json_lines(src):
        if not isinstance(obj, dict) or not isinstance(obj.get("outputs", obj.get("choices")),
                                                       list):
            raise CopeInputError(f"line {i}: expected a request output with 'outputs' or an "
                                 "OpenAI response with 'choices'", source=src,
                                 field="outputs")
        rid = obj.get("request_id", obj.get("id", i))
        P = _ids_list(obj.get("prompt_token_ids"), src, f"line {i}", "prompt_token_ids")
        for j, c in enumerate(obj.get("outputs", obj.get("choices")) or []):
            if not isinstance(c, dict):
                raise CopeInputError(f"line {i}: output {j} is not an object", source=src,
                                     field="outputs")
            where = f"line {i} output {c.get('index', j)}"
            Pc = _ids_list(c.get("prompt_token_ids"), src, where, "prompt_token_ids")
            G = _ids_list(c.get("token_ids"), src, where, "token_ids")
            out.append((f"{os.path.basename(src)}: request {rid} output "
                        f"{c.get('index', j)}", c.get("routed_experts"),
                        Pc if Pc is not None else P, G))
    return out


def import_vllm(paths: Sequence[str | os.PathLike], model: ModelGeometry, *,
                context_start: int = 0,
                prompt_tokens: int | None = None) -> tuple[Trace, ImportReport]:
    """Import vLLM's returned routed experts (formats in the module docstring)."""
    g = model
    blocks: list[Block] = []
    reports: list[PromptReport] = []
    notes: list[str] = []
    srcs = existing_files(paths)
    for src in srcs:
        if src.endswith((".npy", ".npz")):
            items = [_vllm_npz(src, prompt_tokens)]
        else:
            items = _vllm_lines(src)
        for label, value, P, G in items:
            if value is None:
                notes.append(f"{label}: routed_experts is null (capture off, or the request was "
                             "aborted before any forward pass): skipped")
                continue
            arr = _decode_array(value, src, label)
            dec, ctx, pre = _vllm_prompt(arr, P, G, g, src, label)
            r, c, rep = prompt_block(label, dec, ctx, len(blocks), g, prefill=pre)
            blocks.append((r, c))
            reports.append(rep)
    notes.append(_ORDER_NOTE)
    return assemble(blocks, reports, g, context_start, "vllm", srcs, tuple(notes))


def _vllm_npz(src: str, prompt_tokens: int | None) -> tuple[str, Any, int | None, int | None]:
    try:
        z = np.load(src, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise CopeInputError(f"not a numpy .npy/.npz file ({' '.join(str(exc).split())})",
                             source=src) from None
    label = os.path.basename(src)
    if isinstance(z, np.ndarray):
        if prompt_tokens is None:
            raise CopeInputError("a bare .npy does not say where the prompt ends: pass the "
                                 "prompt length (--prompt-tokens) or save an .npz with "
                                 "prompt_token_ids", source=src, field="prompt_tokens")
        return label, z, prompt_tokens, None
    if "routed_experts" not in z.files:
        raise CopeInputError(f"arrays {z.files}, expected 'routed_experts'", source=src,
                             field="routed_experts")
    P = (len(z["prompt_token_ids"]) if "prompt_token_ids" in z.files
         else int(z["num_prompt_tokens"]) if "num_prompt_tokens" in z.files else prompt_tokens)
    G = len(z["token_ids"]) if "token_ids" in z.files else None
    return label, z["routed_experts"], P, G


_EXTEND, _DECODE, _MIXED, _IDLE = 1, 2, 3, 4


def _sglang_records(src: str) -> tuple[list[dict], np.ndarray | None]:
    import torch  # the dump is a torch.save pickle; weights_only refuses anything but data

    try:
        data = torch.load(src, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a bad file; all mean "not a dump"
        why = " ".join(str(exc).split())[:120]
        raise CopeInputError(f"not a torch.save file of plain data ({why})", source=src) from None
    if not isinstance(data, dict) or not isinstance(data.get("records"), list):
        raise CopeInputError("expected a per_token expert-distribution dump: a dict with "
                             "'records' (recorder mode per_token)", source=src, field="records")
    p2l = data.get("last_physical_to_logical_map")
    return data["records"], None if p2l is None else np.asarray(p2l, dtype=np.int64)


def _sglang_pass(rec: Any, src: str) -> tuple[int, int, list[int], list[int] | None, np.ndarray]:
    if not isinstance(rec, dict):
        raise CopeInputError("a record is not a dict", source=src, field="records")
    fid = rec.get("forward_pass_id", "?")
    try:
        mode = int(rec["forward_mode"])
        pos = [int(p) for p in rec["positions"]]
        ids = np.asarray(rec["topk_ids_of_layer"], dtype=np.int64)
    except (KeyError, TypeError, ValueError) as exc:
        raise CopeInputError(f"forward pass {fid}: missing or malformed {exc}, expected "
                             "forward_mode, positions and topk_ids_of_layer", source=src,
                             field="records") from None
    if ids.ndim != 3 or ids.shape[1] != len(pos):
        raise CopeInputError(f"forward pass {fid}: topk_ids_of_layer shape {ids.shape}, expected "
                             f"[layers, {len(pos)}, 8]", source=src, field="topk_ids_of_layer")
    lens = rec.get("extend_seq_lens")
    return fid, mode, pos, None if lens is None else [int(n) for n in lens], ids


def import_sglang(paths: Sequence[str | os.PathLike], model: ModelGeometry, *,
                  context_start: int = 0) -> tuple[Trace, ImportReport]:
    """Import SGLang per-token expert-distribution dumps (format in the module docstring)."""
    g = model
    k = g.top_k
    blocks: list[Block] = []
    reports: list[PromptReport] = []
    srcs = existing_files(paths)
    for src in srcs:
        records, p2l = _sglang_records(src)
        prompts: list[dict] = []
        for rec in sorted(records, key=lambda r: r.get("forward_pass_id", 0)
                          if isinstance(r, dict) else 0):
            fid, mode, pos, lens, ids = _sglang_pass(rec, src)
            if mode == _IDLE or not pos:
                continue
            if ids.shape[2] < k:
                raise CopeInputError(f"forward pass {fid}: {ids.shape[2]} id slots, expected at "
                                     f"least top_k = {k}", source=src, field="topk_ids_of_layer")
            cur = prompts[-1] if prompts else None
            if mode in (_EXTEND, _MIXED):
                if lens is not None and len(lens) != 1:
                    raise CopeInputError(f"forward pass {fid}: {len(lens)} requests in one pass, "
                                         "expected one at a time (record with "
                                         "--max-running-requests 1)", source=src,
                                         field="extend_seq_lens")
                if pos[0] == 0:
                    cur = {"rows": [], "ctx": [], "prefill": 0, "next": 0}
                    prompts.append(cur)
                elif cur is None or pos[0] != cur["next"]:
                    raise CopeInputError(f"forward pass {fid}: prefill continues at position "
                                         f"{pos[0]}, expected a new prompt at 0 or position "
                                         f"{None if cur is None else cur['next']} (record with "
                                         "--disable-radix-cache)", source=src, field="positions")
                cur["prefill"] += len(pos)
                cur["next"] = pos[-1] + 1
            elif mode == _DECODE:
                if len(pos) != 1:
                    raise CopeInputError(f"forward pass {fid}: {len(pos)} tokens in a decode "
                                         "pass, expected one request at a time (record with "
                                         "--max-running-requests 1)", source=src,
                                         field="positions")
                if cur is None or pos[0] != cur["next"]:
                    raise CopeInputError(f"forward pass {fid}: decode at position {pos[0]}, "
                                         "expected " + ("a prefill first" if cur is None else
                                                        f"position {cur['next']}"),
                                         source=src, field="positions")
                row = ids[:, 0, :k]
                if p2l is not None:
                    safe = np.clip(row, 0, p2l.shape[1] - 1)
                    row = np.where(row >= 0, p2l[np.arange(row.shape[0])[:, None], safe], -1)
                cur["rows"].append(row)
                cur["ctx"].append(pos[0])
                cur["next"] = pos[0] + 1
            else:
                raise CopeInputError(f"forward pass {fid}: forward_mode {mode}, expected 1 "
                                     "(EXTEND), 2 (DECODE), 3 (MIXED) or 4 (IDLE)", source=src,
                                     field="forward_mode")
        for n, cur in enumerate(prompts):
            label = f"{os.path.basename(src)}: prompt {n}"
            if cur["rows"]:
                dec = _moe_blocks(np.stack(cur["rows"]), g, src, label)
                dec[(dec < 0).any(axis=2)] = -1  # a layer the recorder did not fill is missing
                check_ids(dec, g, src, label)
                ctx = np.asarray(cur["ctx"])
            else:
                dec, ctx = np.zeros((0, g.n_layers, k), np.int64), None
            r, c, rep = prompt_block(label, dec, ctx, len(blocks), g, prefill=cur["prefill"])
            blocks.append((r, c))
            reports.append(rep)
    return assemble(blocks, reports, g, context_start, "sglang", srcs, (_ORDER_NOTE,))
