"""Which node makes a collective slow: pairwise all-reduces in rounds of disjoint pairs.

Pure (no torch): launch_bench/bench.py's gate mode asks it for the next round's pairs, measures them
all at once, and records each pair's bus bandwidth; launch reads the verdict it leaves.

A pair is as fast as its slower node, so a node is judged by its *best* pair. The bar is the
floor (gate.min_busbw_gbs) when one is given, else RATIO times the median of the nodes' best
pairs ("far below the median": a node whose best pair is under half of what the typical node
reaches). A node whose best pair clears the bar is good. A node under it is bad once it has
been measured with a good node (its partner is not to blame), else it is a suspect and is
re-paired with a good node in the next round. Round 1 pairs neighbours (0,1), (2,3), ...;
round 2 gives the odd one out a partner and re-pairs the suspects: one slow node among
healthy ones is named after two rounds.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

RATIO = 0.5          # "far below": under half the median node's best pair
MAX_ROUNDS = 6


def _key(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


@dataclass
class GateSearch:
    nodes: list[str]
    floor: float | None = None               # GB/s; None: judged relative to the others
    ratio: float = RATIO
    measured: dict[tuple[str, str], float] = field(default_factory=dict)   # pair -> busbw
    rounds: list[list[tuple[str, str]]] = field(default_factory=list)

    # ---- the bar and the classes -------------------------------------------------------
    def best(self, node: str) -> float | None:
        values = [bw for pair, bw in self.measured.items() if node in pair]
        return max(values) if values else None

    def bar(self) -> float | None:
        if self.floor is not None:
            return self.floor
        bests = [b for b in (self.best(n) for n in self.nodes) if b is not None]
        # With fewer than two pairs there is nothing to be "far below".
        if len(self.measured) < 2 or len(bests) < 3:
            return None
        return self.ratio * statistics.median_high(bests)

    def good(self) -> list[str]:
        bar = self.bar()
        if bar is None:
            return []
        return [n for n in self.nodes if (self.best(n) or 0.0) >= bar and self.best(n) is not None]

    def suspects(self) -> list[str]:
        bar = self.bar()
        if bar is None:
            return []
        return [n for n in self.nodes if self.best(n) is not None and self.best(n) < bar]

    def bad(self) -> list[str]:
        """Suspects measured with a good node: the pair was slow and the partner is not."""
        good = set(self.good())
        return [n for n in self.suspects()
                if any(other in good for pair in self.measured if n in pair
                       for other in pair if other != n)]

    def unmeasured(self) -> list[str]:
        return [n for n in self.nodes if self.best(n) is None]

    # ---- rounds ---------------------------------------------------------------------------
    def partners(self, node: str) -> set[str]:
        return {other for pair in self.measured if node in pair for other in pair
                if other != node}

    def next_round(self) -> list[tuple[str, str]]:
        """Disjoint pairs to measure next; empty when the verdict is in."""
        if len(self.nodes) < 2 or len(self.rounds) >= MAX_ROUNDS:
            return []
        if not self.measured:
            return self._commit(list(zip(self.nodes[0::2], self.nodes[1::2])))
        bad = set(self.bad())
        waiting = self.unmeasured() + [s for s in self.suspects() if s not in bad]
        if self.floor is None and len(self.nodes) >= 3:
            # Relative mode judges a node by its best pair: every node needs two partners, or
            # the partners of one slow node would look slow too (the head in a 3-node ring).
            waiting += [n for n in self.nodes if len(self.partners(n)) < 2]
        good = self.good()
        others = [n for n in self.nodes if n not in bad]
        busy: set[str] = set()
        pairs: list[tuple[str, str]] = []
        for node in dict.fromkeys(waiting):
            if node in busy:
                continue
            for partner in [*good, *others]:
                if partner != node and partner not in busy \
                        and _key(node, partner) not in self.measured:
                    pairs.append((node, partner))
                    busy.update((node, partner))
                    break
        return self._commit(pairs)

    def _commit(self, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
        if pairs:
            self.rounds.append(list(pairs))
        return pairs

    def record(self, a: str, b: str, busbw: float | None) -> None:
        """busbw in GB/s; None: the pair's all-reduce failed (counted as 0)."""
        self.measured[_key(a, b)] = 0.0 if busbw is None else busbw

    # ---- verdict ----------------------------------------------------------------------------
    def verdict(self) -> dict:
        bar = self.bar()
        bad = self.bad()
        unresolved = [n for n in self.suspects() if n not in bad]
        evidence = {}
        for node in self.nodes:
            pairs = sorted(((bw, [o for o in pair if o != node][0]) for pair, bw in
                            self.measured.items() if node in pair), reverse=True)
            if pairs:
                evidence[node] = ", ".join(f"{bw:.4g} GB/s with {other}" for bw, other in pairs)
        return {
            "mode": "floor" if self.floor is not None else "relative",
            "floor_gbs": self.floor, "ratio": None if self.floor is not None else self.ratio,
            "bar_gbs": bar, "judged": bar is not None,
            "bad": bad, "suspects": unresolved, "good": self.good(),
            "rounds": [[list(p) for p in r] for r in self.rounds],
            "pairs": [{"pair": list(p), "busbw_gbs": bw} for p, bw in self.measured.items()],
            "evidence": evidence,
        }
