"""`Ledger.record_group` keeps a group request's node tuple by identity (no hash of an n-tuple
per booking): the counts must equal one `record` per node whatever objects the nodes come in
(equal tuples, lists, many distinct lists), across pickling, and from a ledger pickled before."""
import pickle
from collections import Counter

from fedmodel.runtime.ledger import Ledger


def _singles(bookings):
    """The ledger booked message by message: the independent answer."""
    one = Ledger()
    for nodes, kind, floats, down in bookings:
        for node in nodes:
            if down:
                one.record("server", node, kind, floats)
            else:
                one.record(node, "server", kind, floats)
    return one


def test_equal_tuples_lists_and_many_distinct_node_lists():
    bookings = []
    for k in range(150):                    # > 64 distinct node lists: folded on the way
        nodes = [f"c{j}" for j in range(k % 7 + 1)]
        bookings.append((tuple(nodes), "solve", 3, True))     # a new, equal tuple each time
        bookings.append((nodes, "solve", 4, False))            # a list
    group = Ledger()
    for nodes, kind, floats, down in bookings:
        group.record_group(nodes, kind, floats, down)
    assert len(group._node_lists) <= 65
    one = _singles(bookings)
    assert group.messages == one.messages and group.floats == one.floats
    assert group.total() == one.total()


def test_pickled_with_pending_bookings_and_old_pickles():
    group = Ledger()
    nodes = ("a", "b")
    group.record_group(nodes, "k", 5, True)
    restored = pickle.loads(pickle.dumps(group))
    restored.record_group(("a", "b"), "k", 5, True)
    assert restored.messages == Counter({("server", "a", "k"): 2, ("server", "b", "k"): 2})
    # a ledger pickled before node tuples were kept by id: pending keyed by the tuple itself
    old = Ledger.__new__(Ledger)
    old.__setstate__({"_messages": Counter(), "_floats": Counter(), "rounds": 1,
                      "_pending": Counter({(("a", "c"), "k", False, 2): 3})})
    assert old.floats == Counter({("a", "server", "k"): 6, ("c", "server", "k"): 6})
    old.record_group(("a",), "k", 2, False)
    assert old.messages[("a", "server", "k")] == 4
