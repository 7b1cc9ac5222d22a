"""Runtime: node programs, the executors that carry every message to them, and the ledger."""
from .ledger import Ledger
from .messages import MessageKind, MESSAGES
from .executor import Executor, SerialExecutor, make_executor
from .program import NodeProgram
