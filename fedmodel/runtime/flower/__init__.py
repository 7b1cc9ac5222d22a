"""fedmodel on Flower (docs/flower.md), one job per module:

- `codec`: what crosses the wire — requests and replies as Flower records, their checks against
  the declared message kinds, the build message, the server's push/pull transport;
- `client_app`: the ClientApp a SuperNode runs (`client_app.client_app`): its handler, its cache
  of node programs and their state in Flower's `Context.state`, the client's own data;
- `driver`: `FlowerExecutor`, the ServerApp side (simulation thread, node discovery, rejoin
  and replay, partial participation);
- `secagg`: secure sums through Flower's SecAgg+, both sides.

Nothing is imported here: a SuperNode's worker loads only the ClientApp's modules.
"""
