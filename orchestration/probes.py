"""What ``crossrl validate`` (and ``crossrl run`` before it stores anything) learns from the envs and the engines:
crossrl's :class:`~crossrl.scenarios.checks.Probes`. ``scenarios/`` builds no env and knows no engine, so the checks
get them from here: envs built by :mod:`crossrl.core.envs`, the engine registry's ids and refusals, what the built-in
adapters refuse once a trial starts (RLlib's own config checks, TorchRL's limits), and their resolved settings."""

from __future__ import annotations

from typing import Any


def validate_probes() -> Any:
    """crossrl's :class:`~crossrl.scenarios.checks.Probes`: envs built by crossrl.core.envs, the engine registry's
    ids and refusals, what the built-in adapters refuse once a trial starts, and their resolved settings."""
    from crossrl.adapters.registry import engine_ids, unsupported
    from crossrl.core.envs import env_problems
    from crossrl.scenarios.checks import Probes

    return Probes(
        engine_ids=engine_ids(),
        env_problems=env_problems,
        env_spaces=_env_spaces,
        unsupported=unsupported,
        failing=_engine_failures,
        settings={"crossrl": _crossrl_settings, "rllib": _rllib_settings},
        native_problems=_native_problems,
    )


def _native_problems(spec: Any) -> list[str]:
    """The spec's ``native`` settings for RLlib and TorchRL against those engines' own classes (RLlib's AlgorithmConfig
    methods and their keywords, TorchRL's loss, torch's Adam and the collector by their signatures), for the engines
    the spec runs only: a section for an engine left out (--engines) is unused. One line per key; an engine is
    imported only when the spec has native settings for it."""
    problems: list[str] = []
    if spec.native.get("rllib") and "rllib" in spec.engines:
        from crossrl.adapters.rllib import adapter as rllib

        problems += rllib.native_problems(spec.algorithm.name, spec.native["rllib"])
    if spec.native.get("torchrl") and "torchrl" in spec.engines:
        from crossrl.adapters.torchrl import adapter as torchrl

        firsts = {t.workers: t for t in spec.trials() if t.engine == "torchrl"}  # the collector class follows workers
        for trial in firsts.values():
            problems += [line for line in torchrl.native_problems(in_default_layout(trial)) if line not in problems]
    return problems


def _env_spaces(env: Any) -> Any:
    """Build the env once (as the engines do: make_env, or make_parallel_env) and read its spaces."""
    import warnings

    from crossrl.core.envs import agent_spaces, make_env, make_parallel_env
    from crossrl.scenarios.checks import EnvSpaces

    quiet = env.model_copy(update={"step_latency_ms": 0.0})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if env.multi_agent:
            built = make_parallel_env(quiet)
            try:
                return EnvSpaces(dict(agent_spaces(built)))
            finally:
                built.close()
        single = make_env(quiet)
        try:
            return EnvSpaces({"": (single.observation_space, single.action_space)})
        finally:
            single.close()


def _engine_failures(trials: list[Any], spaces: Any) -> list[tuple[Any, str]]:
    """Trials the engine registry lets through that a built-in engine's adapter refuses once started (each would
    end FAILED), with the reason: RLlib's own config checks (crossrl.adapters.rllib.adapter.check_covered, then
    AlgorithmConfig.validate on the config build_config builds), TorchRL's discrete actions and flat multi-agent
    observations only, and its missing prioritized replay. A reason depends on the engine and the workers only."""
    from crossrl.adapters.registry import engines

    infos = engines()
    out: list[tuple[Any, str]] = []
    reasons: dict[tuple[str, int], str | None] = {}
    for trial in trials:
        info = infos.get(trial.engine)
        if info is None or not info.builtin or trial.engine not in ("rllib", "torchrl"):
            continue
        key = (trial.engine, trial.workers)
        if key not in reasons:
            checked = in_default_layout(trial)
            reasons[key] = _rllib_refusal(checked) if trial.engine == "rllib" else _torchrl_refusal(checked, spaces)
        reason = reasons[key]
        if reason:
            out.append((trial, reason))
    return out


def in_default_layout(trial: Any) -> Any:
    """``trial`` with a layout knob that says ``best`` at its default: `crossrl run` picks the value from the stored
    layout sweeps when it starts (crossrl.measure.bench.best_layout); every value runs the same envs and settings, and
    none that an engine would refuse for the trial is a candidate."""
    from crossrl.scenarios.spec import BEST

    layout = {k: v for k, v in trial.layout.items() if v != BEST}
    return trial.model_copy(update={"layout": layout}) if layout != trial.layout else trial


def _torchrl_refusal(trial: Any, spaces: Any) -> str | None:
    from gymnasium import spaces as gs

    if trial.algorithm == "sac" and int(trial.hyperparams.get("n_step", 1)) != 1:
        # adapters/torchrl/algorithms.py SACLearner: TorchRL 0.14's MultiStep looks ahead within one collector batch
        return (
            "torchrl runs sac with n_step 1 only (TorchRL 0.14's MultiStep looks ahead within one collector batch and "
            "bootstraps through terminations); set algorithm.hyperparams.n_step: 1, or run it on crossrl or rllib"
        )
    for agent, (obs, act) in (spaces.spaces if spaces else {}).items():
        who = f" (agent {agent})" if agent else ""
        if trial.algorithm == "sac" and isinstance(act, gs.Box):
            unit = bool((act.low == -1.0).all() and (act.high == 1.0).all())
            if trial.env.actions != "unit" and not unit:
                return (
                    f"torchrl runs sac on actions in [-1, 1], and {trial.env.id}{who} has {act} with env.actions: env; "
                    "set env.actions: unit (sac's default) or run it on crossrl or rllib"
                )
            continue
        if not isinstance(act, gs.Discrete) and trial.env.multi_agent:
            # adapters/torchrl/multi_agent.py ma_env_dims reads the number of discrete actions
            return (
                f"torchrl's multi-agent adapter runs {trial.algorithm} on discrete actions only, and "
                f"{trial.env.id}{who} has {act}; run it on crossrl (--engines)"
            )
        if isinstance(act, gs.Box) and len(act.shape) != 1:
            # adapters/torchrl/algorithms.py OnPolicyLearner: one Gaussian over a flat action vector
            return (
                f"torchrl runs {trial.algorithm} on flat continuous actions, and {trial.env.id}{who} has {act}; run "
                f"it on crossrl or rllib (--engines)"
            )
        if trial.env.multi_agent and isinstance(obs, gs.Box) and len(obs.shape) != 1:
            return (
                f"torchrl's multi-agent adapter takes flat observations only (MultiAgentMLP), and {agent} observes "
                f"shape {list(obs.shape)}; run it on crossrl (--engines)"
            )
    if trial.algorithm == "dqn" and trial.hyperparams.get("prioritized_replay"):
        # adapters/torchrl/algorithms.py PRIORITIZED_REPLAY_UNAVAILABLE (that module imports torch: not imported here)
        return (
            "torchrl has no prioritized replay (its PrioritizedSampler needs a C++ extension that does not load with "
            "torch 2.13); set algorithm.hyperparams.prioritized_replay: false, or run it on crossrl (--engines)"
        )
    return None


# RLlib's names in its config errors -> the spec's fields (besides the hyperparameters' own map).
_RLLIB_FIELDS = {
    "num_env_runners": "execution.workers",
    "num_envs_per_env_runner": "execution.envs_per_worker",
    "total_train_batch_size": "algorithm.hyperparams.train_batch",
}


def _rllib_refusal(trial: Any) -> str | None:
    from crossrl.adapters.rllib import adapter as rllib
    from crossrl.scenarios.loader import first_line

    try:
        rllib.check_covered(trial)
    except ValueError as e:
        known = set(rllib.HYPERPARAM_MAP[trial.algorithm]) | set(rllib.NOT_EQUALIZABLE[trial.algorithm])
        unmapped = sorted(set(trial.hyperparams) - known)
        if not unmapped:
            return first_line(e)
        them = "it" if len(unmapped) == 1 else "them"
        return (
            f"rllib has no setting for {', '.join(unmapped)} and refuses a {trial.algorithm} trial that sets {them}; "
            f"remove {them} from algorithm.hyperparams, or leave rllib out (--engines)"
        )
    try:
        config = _rllib_config(trial)
        with _quiet():
            config.validate()
    except Exception as e:  # RLlib's own check: a ValueError, whose later lines say how to turn checks off
        message = first_line(e)
        names = {path: f"algorithm.hyperparams.{name}" for name, path in rllib.HYPERPARAM_MAP[trial.algorithm].items()}
        said = [f"{native} is {ours}" for native, ours in {**names, **_RLLIB_FIELDS}.items() if native in message]
        return f"rllib: {message}" + (f" (in the spec: {'; '.join(said)})" if said else "")
    return None


def _rllib_config(trial: Any) -> Any:
    """The trial's RLlib AlgorithmConfig as its adapter builds it (crossrl.adapters.rllib.adapter.build_config), not built
    into an algorithm: RLlib is imported, nothing starts. Its resources are planned for a machine with a CPU per
    worker at least (how many a run gets is the cluster's business, not the spec's)."""
    import os

    from crossrl.adapters.rllib import adapter as rllib

    cpus = float(max(os.cpu_count() or 1, trial.workers))
    plan = rllib.plan_resources(algorithm=trial.algorithm, workers=trial.workers, available_cpus=cpus)
    with _quiet():
        return rllib.build_config(trial, plan=plan, env_name="crossrl-validate")


def _quiet() -> Any:
    """RLlib's and Ray's log lines and Python warnings off (RLlib logs a warning for every config it builds)."""
    import contextlib
    import logging
    import warnings

    @contextlib.contextmanager
    def quiet() -> Any:
        previous = logging.root.manager.disable
        logging.disable(logging.CRITICAL)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                yield
        finally:
            logging.disable(previous)

    return quiet()


def _crossrl_settings(trial: Any) -> list[str]:
    from crossrl.core import algorithms
    from crossrl.scenarios.checks import pairs, workers_text

    alg = algorithms.load(trial.algorithm)
    evaluators = f"{trial.workers} evaluator{'s' if trial.workers != 1 else ''} x {trial.envs_per_worker} envs"
    return [
        f"crossrl, {workers_text(trial.workers)} (the settings crossrl's core runs with and records as its native "
        "config):",
        f"  optimizer: {trial.optimizer}; transport: {trial.transport}; policy: {alg.policy_cls.__name__}; "
        f"{evaluators}; reward clip: {'sign' if trial.env.resolved_reward_clip else 'off'}",
        f"  hyperparams: {pairs(alg.hyperparams(trial.hyperparams, trial.native.get('settings')))}",
        f"  model: {pairs(trial.model.model_dump(mode='json'))}",
    ]


def _rllib_settings(trial: Any) -> list[str]:
    from crossrl.adapters.rllib import adapter as rllib
    from crossrl.scenarios.checks import pairs, workers_text

    trial = in_default_layout(trial)
    config = _rllib_config(trial)
    runners = {
        "num_env_runners": config.num_env_runners,
        "num_envs_per_env_runner": config.num_envs_per_env_runner,
        "rollout_fragment_length": config.rollout_fragment_length,
        "num_learners": config.num_learners,
    }
    settings = rllib.training_settings(trial, num_env_runners=config.num_env_runners)
    settings |= trial.native.get("training", {})  # native.rllib.training, called last: its values win
    settings.pop("rollout_fragment_length", None)
    # The keys RLlib's default RLModules read for this network (an MLP encoder, or a CNN encoder and MLP heads).
    keys: tuple[str, ...] = ("fcnet_hiddens", "fcnet_activation", "head_fcnet_hiddens", "vf_share_layers")
    if trial.model.conv:
        keys = ("conv_filters", "conv_activation", "head_fcnet_hiddens", "head_fcnet_activation", "vf_share_layers")
    model = {k: v for k, v in dict(config.model_config).items() if k in keys}
    return [
        f"rllib, {workers_text(trial.workers)} (the {type(config).__name__} that crossrl.adapters.rllib.adapter.build_config "
        "builds):",
        f"  env_runners: {pairs(runners)}",
        f"  training: {pairs(settings)}",
        f"  rl_module model_config: {pairs(model)}",
    ]
