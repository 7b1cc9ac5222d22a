"""`fedmodel` command line (docs/api.md §7): run a built-in model end to end, list the built-in
models, reproduce paper tables, deploy a model file on Flower."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable


def _run(args: argparse.Namespace) -> int:
    import fedmodel as fm
    from fedmodel import registry
    from fedmodel.builtin_models import MODELS, backend_options
    from fedmodel.problem import make_backend
    name, options = args.backend.lower(), {}
    if args.example in MODELS:
        prob, _ = MODELS[args.example](n_clients=args.clients)
    elif args.example.endswith(".py") and os.path.isfile(args.example):
        # a model file, as `fedmodel deploy` takes it (examples/*.py): its solve_options go
        # with the backend it names
        from fedmodel.deploy import load_problem, model_module   # (imports Flower: only for a file)
        module = model_module(args.example)
        prob = load_problem(module, args.clients)
        if getattr(module, "backend", None) == name:
            options.update(getattr(module, "solve_options", {}))
    else:
        print(f"unknown example {args.example!r}; choose one of {sorted(MODELS)} or a model file "
              "(a .py defining make_problem(n_clients), e.g. examples/ring_lasso.py)", file=sys.stderr)
        return 2
    size = sum(v.size for v in prob.shared_variables() if not getattr(v, "is_slack", False))
    print(f"{prob.name}: {len(prob.clients)} clients, {size} shared parameters; backend {args.backend}")
    refusal = _refusal(name, prob)
    if refusal:
        print(f"error: --backend {name} {refusal}", file=sys.stderr)
        return 2
    backend = name
    if name in registry.names("backend") and args.example in MODELS:
        backend = make_backend(name, **backend_options(name, args.topology))
    if args.topology and name != "cvxpy":
        options["topology"] = _topology(args.topology, prob)   # (bad: FedModelError, rc 2)
    try:
        result = prob.solve(backend, verbose=True, **options)  # the bar shows only on a terminal
    except fm.errors.TopologyError as exc:
        if "needs a server" not in str(exc) and "needs a star" not in str(exc):
            raise
        # the library's advice names its Python API; on the command line it is an option
        raise fm.errors.TopologyError(f"--backend {name} runs on a star (a server and its clients), "
                                      f"not on --topology {args.topology}; use --topology star, "
                                      f"or --backend dald (or auto) on a graph") from exc
    print(result)
    inner = result.info.get("inner")
    if isinstance(inner, dict):      # ProxAL's subproblem solver: which ran and why (backends/proxal_inner.py)
        print(f"  inner          {inner['name']}: {inner['reason']}")
    ok = result.status == "converged"
    if args.verify:
        report = fm.verify(result)
        print(report)
        ok = ok and report.ok
    if args.plot:
        paths = fm.plot(result, args.plot, topology=options.get("topology"))
        print("plots:", ", ".join(map(str, paths)) if paths else
              f"none (backend {result.backend} records no convergence history)")
    return 0 if ok else 1


# Backends `fedmodel run` refuses for a model, before the run, with what to use instead:
# name -> (does it refuse this problem?, why).
_ALTERNATIVE = "use --backend proxal or --backend dald (or cvxpy, centralized)"
_BIASED = ("does not solve this model: its server step projects the server's sets and the "
           "clients' data-free balls and bounds, but its fixed point keeps every other client "
           "constraint (one that reads the client's data, e.g. Neyman-Pearson's) at the client's "
           "own iterate, not at their average, so it stops at a point that is not the model's "
           "solution; ")


def _held_by_clients(prob) -> bool:
    """Whether FedAvg / FedProx / DGD would leave a constraint at each client's own iterate: one
    their server step does not project (`backends.projecting`: it projects the server's sets and
    the clients' data-free balls and bounds). They solve the others (newuser13: client balls,
    server boxes and halfspaces, per-client bounds, verified) — this refused every constraint."""
    from fedmodel.backends.projecting import data_free_client_sets, projectable
    moved = data_free_client_sets(prob)

    def held(c) -> bool:     # (a data-free constraint on a client's private variables is its own)
        local = not c.expr.data_owners() and all(v.owner is not None for v in c.expr.variables())
        return not local and not any(c is m for m in moved)
    return any(held(c) for block in prob.clients for c in block.constraints) \
        or not all(projectable(c) for c in prob.server.constraints)


REFUSALS: dict[str, tuple[Callable, str]] = {
    **{name: (_held_by_clients, _BIASED + _ALTERNATIVE) for name in ("fedavg", "fedprox", "dgd")},
    "pa": (lambda prob: len(prob.clients) != 1 or bool(prob.server.terms or prob.server.constraints),
           "(the proximal algorithm) runs one client with no server block; " + _ALTERNATIVE),
    # measured on neyman-pearson (5 clients), newuser13 (2026-12-01): converged, verified, in
    # 15,404 rounds (39 s at load ~8) where auto's ProxAL took 45 round trips, now 36 (it read "over
    # 20,000 rounds, 842 s, still 5.5e-2 from the optimum" — measured before issue 25 item 4's fix)
    "dp-admm": (lambda prob: any(c.constraints for c in prob.clients),
                "is for private training; on client constraints its non-private run is slow "
                "(neyman-pearson: 15,404 rounds where ProxAL takes 36 round trips); "
                + _ALTERNATIVE),
}


# --topology NAME or NAME:ARG -> (builder's name, how ARG becomes its arguments, ARG's form)
TOPOLOGIES: dict[str, tuple[str, Callable | None, str]] = {
    **{name: (name, None, name) for name in ("star", "path", "ring", "complete")},
    "grid": ("grid", lambda arg: dict(zip(("rows", "cols"), map(int, arg.lower().split("x", 1)))),
             "grid:ROWSxCOLS (e.g. grid:2x3 for 6 clients)"),
    "erdos_renyi": ("erdos_renyi", lambda arg: {"p": float(arg), "seed": 0},
                    "erdos_renyi:P (edge probability, e.g. erdos_renyi:0.5; seed 0)"),
    "random_regular": ("random_regular", lambda arg: {"degree": int(arg), "seed": 0},
                       "random_regular:DEGREE (e.g. random_regular:2; seed 0)"),
}


def _topology(text: str, prob):
    """The graph `--topology NAME[:ARG]` names (docs/api.md §7), or FedModelError saying why not:
    a topology's own parameters come after a colon (grid:2x3), every other name is unknown."""
    from fedmodel import topologies
    from fedmodel.errors import TopologyError
    name, _, arg = text.partition(":")
    forms = ", ".join(form for _, _, form in TOPOLOGIES.values())
    if name not in TOPOLOGIES:
        raise TopologyError(f"unknown topology {text!r}; choose one of: {forms}")
    builder, parse, form = TOPOLOGIES[name]
    if parse is None and (arg or text != name):      # (star: too: a parameter that is not there)
        raise TopologyError(f"--topology {name} takes no parameter")
    if parse is not None and not arg:
        raise TopologyError(f"--topology {name} needs its parameter: write {form}")
    try:
        kwargs = parse(arg) if parse else {}
        if name == "grid" and (len(kwargs) != 2 or min(kwargs.values()) < 1):
            raise ValueError(arg)
    except ValueError:
        raise TopologyError(f"--topology {text!r}: write it as {form}") from None
    return getattr(topologies, builder)(prob, **kwargs)


def _refusal(name: str, prob) -> str | None:
    """Why `fedmodel run` will not run backend `name` on `prob` (None: it runs)."""
    refuses, why = REFUSALS.get(name, (None, ""))
    return why if refuses is not None and refuses(prob) else None


def _examples(_: argparse.Namespace) -> int:
    from fedmodel.builtin_models import MODELS
    for name, builder in MODELS.items():
        print(f"{name:20s} {builder.__doc__.strip().splitlines()[0]}")
    return 0


def _reproduce(args: argparse.Namespace) -> int:
    try:
        from fedmodel.reproductions import REPRODUCTIONS
    except ModuleNotFoundError as exc:
        if exc.name != "fedmodel.reproductions":
            raise
        print("no paper reproductions are available in this installation", file=sys.stderr)
        return 2
    if args.name not in REPRODUCTIONS:
        print(f"unknown reproduction {args.name!r}; choose one of {sorted(REPRODUCTIONS)}", file=sys.stderr)
        return 2
    options = {"rounds": args.rounds, "plot_dir": args.plot}
    return REPRODUCTIONS[args.name](full=args.full, **{k: v for k, v in options.items() if v is not None})


def _deploy(args: argparse.Namespace) -> int:
    import json
    import tempfile
    from fedmodel.deploy import Deployment
    workdir = args.workdir or tempfile.mkdtemp(prefix="fedmodel-deploy-")
    deployment = Deployment(args.model, args.clients, workdir, timeout=args.timeout, tls=args.tls,
                            data=args.data)
    deployment.write_app()
    print("\n".join(deployment.commands()))
    if args.print_only:
        return 0
    print(f"starting a SuperLink and {len(deployment.names)} SuperNodes on 127.0.0.1 "
          f"({'TLS' if args.tls else 'insecure'}; logs in {workdir})")
    with deployment:
        result = deployment.run()
    print(json.dumps({k: result[k] for k in ("status", "objective", "max_violation", "values",
                                             "round_trips", "wire_bytes", "seconds")}, indent=1))
    return 0


def _positive_int(what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"needs at least 1 {what}, got {value}")
        return value
    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fedmodel", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a built-in example model end to end")
    run.add_argument("example", nargs="?", default="neyman-pearson",
                     help="a built-in model (fedmodel examples) or a model file, e.g. examples/ring_lasso.py")
    run.add_argument("--backend", default="auto",
                     help="auto (default: picked for the model), proxal (its subproblems by "
                     "federated Newton steps where they fit, else Algorithm 2's ADMM), cvxpy, dald, …")
    run.add_argument("--topology", default=None, help="star, path, ring, complete, grid:ROWSxCOLS, "
                     "erdos_renyi:P or random_regular:DEGREE (default: star)")
    run.add_argument("--clients", type=_positive_int("client"), default=5)
    run.add_argument("--verify", action="store_true", help="print the verification table")
    run.add_argument("--plot", default=None, metavar="DIR", help="write convergence plots to DIR")
    run.set_defaults(func=_run)
    examples = sub.add_parser("examples", help="list the built-in example models (for `run`)")
    examples.set_defaults(func=_examples)
    reproduce = sub.add_parser("reproduce", help="run a paper reproduction")
    reproduce.add_argument("name", help="table1, table2, table4 (ProxAL), tableI, tableII, fig5 "
                           "(DALD), insa-table1, insa-table2 (FedADMM-InSa), dp-mnist (DP-IADMM), "
                           "dp-constrained (DP-IADMM with constraints), dp-budget (DP-IADMM at a total ε)")
    reproduce.add_argument("--full", action="store_true", help="the full table (slow: minutes to "
                           "hours); without it a subset that runs in about 2 minutes or less and "
                           "prints what it covers")
    reproduce.add_argument("--rounds", type=_positive_int("round"), default=None,
                           help="number of rounds (insa-table1, insa-table2, dp-mnist, dp-constrained)")
    reproduce.add_argument("--plot", default=None, metavar="DIR",
                           help="write the figures to DIR (fig5, insa-table1, insa-table2, dp-mnist)")
    reproduce.set_defaults(func=_reproduce)
    deploy = sub.add_parser("deploy", help="run a model file on Flower: a SuperLink and one "
                            "SuperNode per client as processes on 127.0.0.1 (docs/flower.md)")
    deploy.add_argument("model", help="a model file defining make_problem(n_clients) or problem, "
                        "optionally backend and solve_options")
    deploy.add_argument("--clients", type=_positive_int("client"), default=2)
    deploy.add_argument("--workdir", default=None, help="where the app, logs and result go "
                        "(default: a new temporary directory)")
    deploy.add_argument("--timeout", type=float, default=120.0,
                        help="seconds to wait for the replies of one round trip")
    deploy.add_argument("--tls", action="store_true", help="TLS with a self-signed certificate "
                        "(written to WORKDIR/certificates) instead of insecure connections")
    deploy.add_argument("--data", default=None, metavar="DIR/{client}",
                        help="each client's data directory, with {client} for its name (DIR/c0/"
                        "A.npy for data 'A' of client c0): the SuperNode's own node config; the "
                        "model file's loaders never run in a deployment")
    deploy.add_argument("--print-only", action="store_true",
                        help="write the app and print the commands for separate hosts; start nothing")
    deploy.set_defaults(func=_deploy)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except Exception as exc:  # noqa: BLE001 - errors for bad input are printed, not dumped
        from fedmodel.errors import FedModelError
        if isinstance(exc, FedModelError):
            print(f"error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
