"""The model's structure table (`proftune profile --structure`) beside ``torchinfo.summary``.

ResNet-18 (torchvision, random weights, 1x3x224x224) and BERT-base (transformers' BertConfig,
random weights, batch 1 x 128 tokens). For each: total params and MACs, ours and torchinfo's and
the ratio; how many modules' params agree; per-layer MACs where both use one convention (conv
layers; Linear after the sequence length that torchinfo leaves out); and the wall time of one
summary, median of ``--repeats`` (one thread).

torchinfo's MACs are ``output[0] x params`` per leaf layer (bias and BatchNorm included, conv
``params x output spatial``; functional ops such as attention matmuls count 0); ours are
torch's FLOP counter's per op, so they differ on a transformer by the sequence length and the
attention, and on a convnet by the BatchNorm and bias terms only.

    python benchmarks/structure.py [--repeats 3] [--skip-bert]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
import torchinfo
from torch import nn

from proftune.profile import model_structure


def _torchinfo_rows(model: nn.Module, info: Any) -> dict[str, Any]:
    names: dict[int, str] = {}
    for name, mod in model.named_modules():
        names.setdefault(id(mod), name)
    rows: dict[str, Any] = {}
    for li in info.summary_list:
        if id(li.module) in names:
            rows.setdefault(names[id(li.module)], li)
    return rows


def _timed(fn: Any, repeats: int) -> tuple[Any, float]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, statistics.median(times)


def compare(label: str, model: nn.Module, example: Any, repeats: int, *, tokens: int | None = None) -> None:
    ours, our_s = _timed(lambda: model_structure(model, example), repeats)
    info, their_s = _timed(lambda: torchinfo.summary(model, input_data=example, verbose=0, depth=50), repeats)
    theirs = _torchinfo_rows(model, info)
    rows = {r.name: r for r in ours.rows}
    same_params = sum(rows[n].params == li.num_params for n, li in theirs.items() if n in rows)
    conv = [(rows[n].macs, li.macs) for n, li in theirs.items() if n in rows and rows[n].type.startswith("Conv")]
    lin = [(n, li) for n, li in theirs.items() if n in rows and rows[n].type == "Linear"]
    print(f"\n{label}")
    print(f"  {'':28s} {'proftune':>16s} {'torchinfo':>16s} {'ratio':>8s}")
    print(f"  {'total params':28s} {ours.params_total:16,d} {info.total_params:16,d} "
          f"{ours.params_total / info.total_params:8.4f}")
    print(f"  {'total MACs':28s} {ours.macs:16,d} {info.total_mult_adds:16,d} {ours.macs / info.total_mult_adds:8.4f}")
    print(f"  {'summary time (s, median)':28s} {our_s:16.3f} {their_s:16.3f} {our_s / their_s:8.3f}")
    print(f"  modules with equal params: {same_params} of {len(theirs)} torchinfo lists")
    if conv:
        print(f"  conv layers with equal MACs: {sum(a == b for a, b in conv)} of {len(conv)}")
    if lin and tokens:
        # torchinfo: batch x (in + 1) x out; ours: batch x tokens x in x out (the pooler: 1 token)
        same = 0
        for n, li in lin:
            mod = dict(model.named_modules())[n]
            rows_seen = rows[n].macs // max(mod.in_features * mod.out_features, 1)
            same += li.macs * rows_seen * mod.in_features == rows[n].macs * (mod.in_features + 1)
        print(f"  Linear layers where ours = torchinfo x tokens x in/(in+1): {same} of {len(lin)}")
        leaf_linear = sum(rows[n].macs for n, _ in lin)
        print(f"  of our MACs: Linear {leaf_linear:,}, the rest (attention QK^T and AV) {ours.macs - leaf_linear:,}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-bert", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    import torchvision

    resnet = torchvision.models.resnet18().eval()
    compare("ResNet-18, 1x3x224x224", resnet, torch.randn(1, 3, 224, 224), args.repeats)
    if not args.skip_bert:
        import transformers

        cfg = transformers.BertConfig()
        bert = transformers.BertModel(cfg).eval()
        ids = torch.randint(0, cfg.vocab_size, (1, 128))
        compare("BERT-base, batch 1 x 128 tokens", bert, {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                args.repeats, tokens=128)


if __name__ == "__main__":
    main()
