"""Running trials: one process per trial, supervised, checkpointed, resumed, fanned out over a cluster, searched.

``runner.py`` runs a scenario's trials (``run_scenario``), each in a child process (``trial_proc.py``) and records
them in the store; ``trials.py`` the trial list of a run and of a resumed run; ``watch.py`` a trial's env faults and
stalls; ``signals.py`` and ``procs.py`` stop signals and process trees; ``fanout.py`` trials over a Ray cluster;
``tuning.py`` `crossrl tune` on Ray Tune; ``probes.py`` what `crossrl validate` learns from envs and engines;
``evaluate.py`` a trained policy played back from its checkpoint.

May import: ``crossrl.scenarios``, ``crossrl.core``, ``crossrl.reports``, ``crossrl.adapters`` and itself; never the
measurement tools (``crossrl.measure``) or the CLI (``tests/unit/test_layers.py`` holds the rule).
"""
