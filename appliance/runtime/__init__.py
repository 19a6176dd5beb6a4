"""What runs: the runtime and everything it owns while the appliance is up.

`runtime.py` (start, stop, the control interface) with `control.py` (one change at a time),
`running.py` (the running streams by id, and what each is wired to), `reads.py` (the status
snapshots), `streams.py` (a stream's threads and lifecycle), `supervisor.py` (stalled streams),
`workflows.py` and `checking.py` (compile once, report every problem), `outputs.py`
(results to sinks and subscribers), `commands.py` (the command catalogue), `reload.py` /
`reloading.py` / `retuning.py` (changes applied to a running runtime) and `sharding.py`
(which process runs which stream). It uses sources/, models/, profiling/ and observe/;
nothing here imports server/, workers/ or cli/.
"""
