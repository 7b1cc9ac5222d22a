"""The Flower executor's former single module, kept as a re-export so that imports, entry points
and deployed apps that name it (`fedmodel.runtime.flower_executor:FlowerExecutor`, an app's
`client.py` written by an earlier `fedmodel deploy`: `...flower_executor import client_app`)
keep working. The code lives in `fedmodel.runtime.flower` (codec, client_app, driver, simulation, membership,
secagg, timings).
"""
from .flower.client_app import (CLIENT_MODULES_ENV, client_app, load_client_modules, node_data,
                                served_kind)
from .flower.codec import (BUILD, HELLO, NODE_DATA_KEY, NODE_NAME_KEY, PULL_INTERVAL, REPLAY,
                           check_request, decode, encode, wire_size)
from .flower.driver import FlowerExecutor, NodeTimeout

__all__ = ["BUILD", "CLIENT_MODULES_ENV", "FlowerExecutor", "HELLO", "NODE_DATA_KEY",
           "NODE_NAME_KEY", "NodeTimeout", "PULL_INTERVAL", "REPLAY", "check_request",
           "client_app", "decode", "encode", "load_client_modules", "node_data", "served_kind",
           "wire_size"]
