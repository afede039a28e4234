"""The engine step's phases inside a running server (step_phases.py, as bench_structured.py
--phases gives them offline): put this directory and the repository's root on PYTHONPATH
with PHASES_OUT set, and every
Python process started with it times the phases; the one that steps (the engine core) writes
its report to PHASES_OUT.<pid>.json twice a second. Touching PHASES_OUT.reset starts the
counts afresh (before each measured run).

    PHASES_OUT=/tmp/ph PYTHONPATH=$PWD:$PWD/benchmarks/engine/server_phases minivllm serve DIR ...
    touch /tmp/ph.reset; python -m benchmarks.engine.bench_serving --port 8000 ...; sleep 1
    cat /tmp/ph.*.json

Without PHASES_OUT nothing happens. The timers are installed from a thread of its own, which
imports the engine's modules beside the program's own start-up.
"""

import os

_OUT = os.environ.get("PHASES_OUT")
if _OUT:
    import json
    import threading
    import time

    def _report_loop(out: str) -> None:
        from benchmarks.engine.step_phases import StepPhases

        phases = StepPhases()
        phases.install()
        reset_seen = 0.0
        while True:
            time.sleep(0.5)
            try:
                reset_at = os.path.getmtime(out + ".reset")
            except OSError:
                reset_at = 0.0
            if reset_at > reset_seen:
                reset_seen = reset_at
                phases.uninstall()
                phases = StepPhases()
                phases.install()
            elif phases.num_steps:
                path = f"{out}.{os.getpid()}.json"
                with open(path + ".tmp", "w") as f:
                    json.dump(phases.report(), f)
                os.replace(path + ".tmp", path)  # a reader never sees half a report

    threading.Thread(target=_report_loop, args=(_OUT,), daemon=True).start()
