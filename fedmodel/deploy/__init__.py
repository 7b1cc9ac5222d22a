"""Deployment on Flower: a model file becomes a Flower app; a real SuperLink and one SuperNode
per client run as separate processes (`fedmodel deploy MODEL.py --clients N`, docs/flower.md).
An application (it solves the model file's problem), on top of the runtime's `FlowerExecutor`.

The model file defines `make_problem(n_clients) -> Problem` (or a module-level `problem`) and
optionally `backend` (a name or a backend instance; default: `Problem.solve`'s),
`solve_options` (a dict for `Problem.solve`) and `flower_options` (a dict for the
`FlowerExecutor`: `secure_sum`, `max_restarts`). `Deployment.write_app` writes a Flower app around a copy of it:

- `server.py`: `server_app` (`app.py`). Flower starts it in the SuperLink's `flwr-serverapp`
  process; it imports the model, builds the problem (loaders do not run there) and solves it
  with a `FlowerExecutor` on the ServerApp's grid, then writes the result as JSON;
- `client.py`: `client_app` of `fedmodel.runtime.flower.client_app`. Each SuperNode runs it for
  its messages; a node learns which client it is from `--node-config 'fedmodel-client="c0"'`,
  builds that client's program from the declarative spec the server sends, and reads the
  client's data from its own files (`fedmodel-data="DIR"`: DIR/NAME.npy per data name;
  `Deployment(data=...)`). The model file's loaders never run in a deployment (they are what a
  serial run in one process uses).

Each SuperNode runs with `--isolation process` and one long-lived fedmodel process serves all
its messages (`runtime.flower.node_process`, started by `supernode.run_supernode`); the app's
`client.py` is then not used (it is for `node_process=False`: Flower's `flwr-clientapp` per message).

`Deployment.start` (`deployment.py`) launches the processes on 127.0.0.1 (insecure, or TLS with
a self-signed certificate: `tls=True`), `run` submits the app with `flwr run` and waits for the
result, `close` ends every process it started by its process group id. `commands()` are the same
commands for separate hosts.
"""
from .app import APP_PACKAGE, load_problem, model_module, server_app
from .deployment import POLL_ENV, SUPERLINK_ENV, Deployment
from .supernode import SUPERNODE_POLL_ENV, run_supernode

__all__ = ["APP_PACKAGE", "Deployment", "POLL_ENV", "SUPERLINK_ENV", "SUPERNODE_POLL_ENV",
           "load_problem", "model_module", "run_supernode", "server_app"]
