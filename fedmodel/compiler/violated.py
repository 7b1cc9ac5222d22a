"""`info["violated"]` restated under other names or in other units — a verdict's constraints
("name: form" → violation) and the messages of `info` that quote them ("name: form (by v)",
"name: form by v"): the backends' verdicts at the returned point in each constraint's own
units (`backends.verdicts.restate_violated`), an epigraph copy's slack rows as the client loss
they rewrite (`compiler.epigraph`)."""
from __future__ import annotations

import math


def restate(info: dict, changes: dict[str, tuple[str, float]]) -> None:
    """Each key of info["violated"] found in `changes` becomes its (key, violation); keys that
    become one keep the largest violation; largest first, as the verdicts order them."""
    violated = info.get("violated")
    if not isinstance(violated, dict) or not changes:
        return
    out: dict[str, float] = {}
    for key, value in violated.items():
        new_key, new_value = changes.get(key, (key, value))
        out[new_key] = max(out.get(new_key, -math.inf), new_value)
        if (new_key, new_value) == (key, value):
            continue
        for old, new in ((f"{key} (by {value:.3g})", f"{new_key} (by {new_value:.3g})"),
                         (f"{key} by {value:.3g}", f"{new_key} by {new_value:.3g}")):
            for name, text in info.items():
                if isinstance(text, str) and old in text:
                    info[name] = text.replace(old, new)
    info["violated"] = dict(sorted(out.items(), key=lambda item: -item[1]))
