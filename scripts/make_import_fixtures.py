"""Write the routing dumps the runtime importers are tested on (tests/data/import/).

``vllm``: run with a Python that has vLLM (``~/.cache/cope-explorer/venv-vllm-*/bin/python``,
set up by scripts/runtimes.sh). The request outputs are vLLM's own ``RequestOutput`` and
``CompletionOutput`` objects, the OpenAI response is vLLM's own ``CompletionResponse`` with the
routed experts encoded by vLLM's ``numpy2base64``, exactly as ``vllm serve`` answers a
``/v1/completions`` request with ``return_token_ids``. The offline JSON lines use the dump
snippet docs/traces.md gives users.

``sglang``: SGLang does not install on this machine, so the per_token dump is built with plain
torch following the recorder's code (sgl-project/sglang
python/sglang/srt/eplb/expert_distribution.py @ 02295fe5ac5ccff3e8829800d50450351c56fb53:
``_DetailSinglePassGatherer`` fills an int32 ``[layers, tokens, 8]`` buffer reset to -1,
``_DetailAccumulator.dump`` saves ``{"records", "last_physical_to_logical_map"}``).

The routing is drawn from a seeded generator; tests re-derive what the import must give from the
files themselves. Run: ``python scripts/make_import_fixtures.py vllm|sglang [--out DIR]``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "import"
# deepseek-v2-lite cut to 3 MoE layers (--layers 3): 4 blocks, the first dense; top-6 of 64
BLOCKS, DENSE, E, K = 4, 1, 64, 6


def _routing(rng: np.random.Generator, rows: int) -> np.ndarray:
    """vLLM's capture buffer for ``rows`` positions: zeros for the dense block."""
    out = np.zeros((rows, BLOCKS, K), np.int32)
    for r in range(rows):
        for b in range(DENSE, BLOCKS):
            out[r, b] = rng.choice(E, K, replace=False)
    return out


def dump_request_output(o) -> str:
    """The JSON line docs/traces.md asks vLLM users to write per finished ``RequestOutput``."""
    return json.dumps({
        "request_id": o.request_id, "prompt_token_ids": o.prompt_token_ids,
        "outputs": [{"index": c.index, "token_ids": list(c.token_ids),
                     "finish_reason": c.finish_reason,
                     "routed_experts": None if c.routed_experts is None
                     else c.routed_experts.tolist()} for c in o.outputs]})


def make_vllm(out: Path) -> None:
    from vllm.entrypoints.openai.completion.protocol import (
        CompletionResponse,
        CompletionResponseChoice,
    )
    from vllm.entrypoints.serve.engine.protocol import UsageInfo
    from vllm.outputs import CompletionOutput, RequestOutput
    from vllm.utils.serial_utils import numpy2base64

    rng = np.random.default_rng(15)
    lines = []
    # request 0: P = 5 prompt tokens, two completions (n = 2) of G = 4 and 3 tokens
    # request 1: P = 3, G = 6; request 2: aborted before any forward pass (no routing)
    for rid, P, gs in (("0", 5, (4, 3)), ("1", 3, (6,)), ("2", 4, (1,))):
        outs = []
        for i, G in enumerate(gs):
            routed = None if rid == "2" else _routing(rng, P + G - 1)
            outs.append(CompletionOutput(index=i, text="", token_ids=list(range(100, 100 + G)),
                                         cumulative_logprob=None, logprobs=None,
                                         routed_experts=routed, finish_reason="length"))
        o = RequestOutput(request_id=rid, prompt=None, prompt_token_ids=list(range(1, P + 1)),
                          prompt_logprobs=None, outputs=outs, finished=True)
        lines.append(dump_request_output(o))
    # a missing record: request 1's decode token 3, MoE block 2 left blank by the capturer
    obj = json.loads(lines[1])
    obj["outputs"][0]["routed_experts"][3 + 3][2] = [0] * K
    lines[1] = json.dumps(obj)
    (out / "vllm-offline.jsonl").write_text("\n".join(lines) + "\n")

    # the OpenAI server: one response per line, routed experts as base64 .npy
    resp = []
    for n, (P, G) in enumerate(((6, 5), (2, 3))):
        routed = _routing(rng, P + G - 1)
        choice = CompletionResponseChoice(index=0, text="", finish_reason="length",
                                          prompt_token_ids=list(range(1, P + 1)),
                                          token_ids=list(range(200, 200 + G)),
                                          routed_experts=numpy2base64(routed))
        r = CompletionResponse(id=f"cmpl-fixture-{n}", created=0, model="deepseek-v2-lite",
                               choices=[choice],
                               usage=UsageInfo(prompt_tokens=P, completion_tokens=G,
                                               total_tokens=P + G))
        resp.append(r.model_dump_json())
    (out / "vllm-openai.jsonl").write_text("\n".join(resp) + "\n")

    # what a user saves from one completion with numpy
    routed = _routing(rng, 4 + 5 - 1)
    np.savez(out / "vllm-request.npz", routed_experts=routed,
             prompt_token_ids=np.arange(1, 5), token_ids=np.arange(300, 305))


def make_sglang(out: Path) -> None:
    import torch

    rng = np.random.default_rng(16)
    n_phys = E + 2  # two redundant physical experts, so the map is not the identity
    p2l = torch.tensor(np.stack([np.r_[np.arange(E), [3, 7]] for _ in range(BLOCKS)]))
    records = []

    def one_pass(mode: int, positions: list[int], lens: list[int] | None,
                 blank: tuple[int, int] | None = None) -> None:
        T = len(positions)
        buf = torch.full((BLOCKS, 16, 8), -1, dtype=torch.int32)   # reset() fills -1
        for b in range(DENSE, BLOCKS if T else DENSE):              # on_select_experts
            ids = np.stack([rng.choice(n_phys, K, replace=False) for _ in range(T)])
            # keep the draw a valid routing once mapped: a redundant copy never meets its
            # original in one token's top-k
            for t in range(T):
                for phys, logical in ((E, 3), (E + 1, 7)):
                    if phys in ids[t] and logical in ids[t]:
                        ids[t][ids[t] == phys] = next(e for e in range(E) if e not in ids[t]
                                                      and e not in (3, 7))
            buf[b, :T, :K] = torch.tensor(ids, dtype=torch.int32)
        if blank is not None:
            buf[blank[0], blank[1], :] = -1
        records.append(dict(forward_pass_id=len(records), rank=0, gatherer_key="primary",
                            input_ids=list(range(T)), positions=positions,
                            extend_seq_lens=lens, forward_mode=mode,
                            topk_ids_of_layer=buf[:, :T, :].clone(), misc_objects=[],
                            global_physical_count=torch.zeros((BLOCKS, n_phys),
                                                              dtype=torch.int32)))

    # prompt A: 5 prompt tokens in one EXTEND pass, 4 DECODE passes
    one_pass(1, list(range(5)), [5])
    for p in range(5, 9):
        one_pass(2, [p], None)
    one_pass(4, [], None)                                         # an IDLE pass
    # prompt B: chunked prefill of 6 tokens, 3 decode passes, the last with a blank layer
    one_pass(1, [0, 1, 2], [3])
    one_pass(1, [3, 4, 5], [3])
    one_pass(2, [6], None)
    one_pass(2, [7], None)
    one_pass(2, [8], None, blank=(2, 0))
    torch.save({"records": records, "last_physical_to_logical_map": p2l},
               out / "expert_distribution_recorder_1700000000.0_0.pt")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("which", choices=["vllm", "sglang"])
    ap.add_argument("--out", default=str(OUT), help="folder to write (default tests/data/import)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (make_vllm if args.which == "vllm" else make_sglang)(out)
    print(f"wrote the {args.which} fixtures to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
