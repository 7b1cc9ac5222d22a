"""Client constraints held in the local solves ("local-al", `local_al`) for a group of
clients at once: the part of `batched_group.Group` that solves their method of multipliers as
one stack (`_solve_held`: each round one batched Newton solve) and reads the certificate's
normal cones for the whole group (`constraint_remainder`, `held_constraints`)."""
from __future__ import annotations

import numpy as np

from . import ball_newton, local_al, local_solvers
from .batched_plan import BatchedPlan


class HeldRows:
    """Mixed into `batched_group.Group` (its plans, stacks and `solve_newton`)."""

    # clients from which "local-al" solves as one stack (`_solve_held`): below, each client's
    # own solve is cheaper (NP monks-1, d = 17, CPU µs per ADMM step per client, stacked vs
    # own: 3,473 vs 2,281 at n = 10, 844 vs 1,787 at n = 20)
    HELD_ROWS = 16

    def _holding(self, rows: np.ndarray) -> bool:
        """Every member `rows` holds its constraints in its local solves, the same count (a
        backend may put them back in one client's AL alone: then they are served one by one)."""
        count = len(self.programs[rows[0]].local_names)     # (names differ: "np[c0]", "np[c1]")
        return count > 0 and all(len(self.programs[r].local_names) == count for r in rows[1:])

    def _held_rest(self, rows: np.ndarray) -> str | None:
        """The method of the rounds of "local-al" (`local_solvers._local_al`: the choice
        without the held constraints), or None unless every member `rows` holds them."""
        return local_solvers.choose(self.programs[rows[0]], "auto", local=False) \
            if self._holding(rows) else None

    def _solve_held(self, Z0, rows, linear, weight, anchor, tol, method, max_steps):
        """"local-al" for the clients `rows` at once (`local_al.solve_rows`): each round one
        batched Newton solve (`solve_newton`) of the clients still running."""
        k, n_x = len(rows), self.n_x
        linear, anchor = (np.broadcast_to(np.asarray(a, float), (k, n_x)) for a in (linear, anchor))
        tols = np.broadcast_to(np.asarray(tol, float), (k,))

        def rest(Z: np.ndarray, idx: np.ndarray) -> tuple:
            return self.solve_newton(Z[idx], rows[idx], linear[idx], weight[idx], anchor[idx],
                                     tols[idx], method, max_steps)

        def values(Z: np.ndarray, idx: np.ndarray) -> np.ndarray:
            full = np.empty((self.n, Z.shape[1]))
            full[:] = Z[idx[0]]                 # non-members: any valid point (values unused)
            full[rows[idx]] = Z[idx]
            return self.held_constraints(full[:, :n_x], full[:, n_x:], jacobians=False)[0][rows[idx]]
        return local_al.solve_rows([self.programs[r] for r in rows], Z0, tols, rest, values)

    def constraint_remainder(self, rows: np.ndarray, x: np.ndarray, R: np.ndarray) -> np.ndarray:
        """`NodeProgram.constraint_remainder(x, r)` of the clients `rows` at the common point x
        (n_x,), R (k, n_x) their gradients: the held constraints' values and Jacobians of the
        whole group by its batched plans (`held_constraints`) and their normal cones at once
        (`local_al.remainder_rows`), then each client's prox terms (one ball a client, no held
        constraint: the balls' normal cones stacked, `ball_newton.remainder`)."""
        rows = np.asarray(rows, dtype=np.intp)
        R = np.array(R, dtype=float)
        if not self._holding(rows):
            if (radii := ball_newton.radii(self, rows)) is not None:     # one ball each: stacked
                return ball_newton.remainder(np.broadcast_to(np.asarray(x, float), R.shape), R, radii)
            return np.array([self.programs[i].constraint_remainder(x, r) for i, r in zip(rows, R)]
                            ).reshape(R.shape)
        X = np.broadcast_to(np.asarray(x, float), (self.n, self.n_x))
        values, jacobians = self.held_constraints(X, self._private())
        programs = [self.programs[i] for i in rows]
        out = local_al.remainder_rows(programs, X[rows], R, values[rows], jacobians[rows])
        if self.prox:
            out = np.array([p.prox_remainder(x, r) for p, r in zip(programs, out)]).reshape(R.shape)
        return out

    def held_constraints(self, X: np.ndarray, Y: np.ndarray, jacobians: bool = True
                         ) -> tuple[np.ndarray, np.ndarray | None]:
        """The values (n, m) and Jacobians ∇ₓg (n, m, n_x) (with `jacobians`, else None) of the
        constraints every member's local solves hold (`local_al.LocalPlans`) at the stacked
        points: one batched plan for the values, one per row of g for the Jacobians (each
        member's θ selecting it)."""
        plans = [local_al.local_plans(p) for p in self.programs]
        if "held_value" not in self._plans:
            self._plans["held_value"] = BatchedPlan([lp.value_plan for lp in plans], self._blocks)
            self._plans["held_gradient"] = BatchedPlan([lp.gradient_plan for lp in plans], self._blocks)
        inputs = self._inputs(X, Y)
        plan = self._plans["held_value"]
        shapes = [c.shape for c in plans[0].constraints]
        values = np.concatenate([self._per_client(v, seg, shape) for v, seg, shape in
                                 zip(plan(*inputs), plan.output_segs, shapes)], axis=1)
        if not jacobians:
            return values, None
        plan, m = self._plans["held_gradient"], plans[0].rows
        shared = self.programs[0].shared.variables          # (∇ₓ: one output per shared variable)
        out = np.empty((self.n, m, self.n_x))
        for row in range(m):
            for lp in plans:
                lp.select(row)
            out[:, row] = np.concatenate([self._per_client(g, seg, v.shape) for g, seg, v in
                                                zip(plan(*inputs), plan.output_segs, shared)], axis=1)
        return values, out

    def _private(self) -> np.ndarray:
        """(n, n_y) stack of the members' private variables (their `program.y`)."""
        return np.array([p.y for p in self.programs], dtype=float).reshape(self.n, self.n_y)
