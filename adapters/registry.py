"""Which engines exist, what each can run, and how to load one (lazily: `crossrl --help` stays instant).

The capability matrix is data, so a spec can be checked before any engine is imported. Extra
engines (a user's own training stack, or the tests' fault-injecting one) are registered with
``CROSSRL_EXTRA_ENGINES="id=package.module:Class[,id2=...]"``; such a class may declare
``algorithms: ClassVar[dict[str, str]]`` (supported algorithm -> note), else it takes every algorithm.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from crossrl.scenarios.catalog import ALGORITHMS, ENGINES
from crossrl.scenarios.loader import SpecError
from crossrl.scenarios.spec import Trial

# The spaces every engine's policies take (scenarios/checks.py space_problems refuses the others at validate): one
# Q-value per action for the DQNs, a squashed Gaussian for SAC, a categorical, factored categorical (MultiDiscrete: one
# per dimension, log-probabilities summed) or Gaussian head for the on-policy ones.
ACTION_SPACES: dict[str, tuple[str, ...]] = {
    "dqn": ("Discrete",),
    "apex": ("Discrete",),
    "sac": ("Box (bounded)",),
    "dreamer": ("Discrete", "Box"),  # RLlib's DreamerV3 actor: one-hot categorical or Gaussian
}
OBSERVATIONS = "Box (flat, or images with algorithm.model.conv), or Dict / Tuple of vectors (flattened)"


@dataclass(frozen=True)
class EngineInfo:
    id: str
    target: str  # "module:Class"
    description: str
    supported: dict[str, str]  # algorithm -> how the engine runs it
    unsupported: dict[str, str] = field(default_factory=dict)  # algorithm -> why not
    builtin: bool = True
    # Multi-agent envs (env.agents set): algorithm -> how the engine runs it; the optimizers it runs them on
    # (crossrl only; empty: any). An extra engine takes them all.
    multi_agent: dict[str, str] | None = None
    multi_agent_optimizers: tuple[str, ...] = ()
    multi_agent_target: str | None = None  # "module:Class" for trials on multi-agent envs, when not ``target``
    # "module:function": load_policy(trial, folder, *, greedy) -> act(obs), a trained policy from a checkpoint's
    # engine folder (`crossrl evaluate`); None: the engine cannot reload one
    policy_loader: str | None = None
    # "module:function": export_policy(trial, folder) -> a pure torch module, obs [B, ...] -> greedy action, from a
    # checkpoint's engine folder (`crossrl export`); None: the engine cannot export one
    policy_exporter: str | None = None
    # algorithm -> the action spaces the engine runs it on, where they differ from every engine's (ACTION_SPACES)
    action_spaces: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def spaces(self, algorithm: str) -> str:
        """The action and observation spaces this engine runs ``algorithm`` on, as `crossrl engines` prints them."""
        actions = self.action_spaces.get(algorithm, ACTION_SPACES.get(algorithm, ("Discrete", "MultiDiscrete", "Box")))
        return f"actions {' or '.join(actions)}; observations {OBSERVATIONS}"

    def reason_unsupported(self, algorithm: str) -> str | None:
        if algorithm in self.supported:
            return None
        return self.unsupported.get(algorithm, f"{self.id} has no {algorithm}")

    def reason_unsupported_trial(self, trial: Trial) -> str | None:
        """Why this engine cannot run ``trial`` (its algorithm, or its algorithm on a multi-agent env), or None."""
        reason = self.reason_unsupported(trial.algorithm)
        if reason or not trial.env.multi_agent or self.multi_agent is None:
            return reason
        if trial.algorithm not in self.multi_agent:
            runs = ", ".join(self.multi_agent) or "none yet"
            return f"{self.id} does not run {trial.algorithm} on multi-agent envs (env.agents) yet; it runs: {runs}"
        if self.multi_agent_optimizers and trial.optimizer not in self.multi_agent_optimizers:
            return (
                f"{self.id} runs multi-agent envs on {', '.join(self.multi_agent_optimizers)} only yet, not "
                f"{trial.optimizer} (execution.optimizer)"
            )
        return None


BUILTIN: dict[str, EngineInfo] = {
    "crossrl": EngineInfo(
        id="crossrl",
        target="crossrl.adapters.crossrl:CrossrlAdapter",
        policy_loader="crossrl.adapters.crossrl:load_policy",
        policy_exporter="crossrl.adapters.crossrl:export_policy",
        description="crossrl's own core on Ray (RLlib paper: policy graph, evaluator actors, optimizers)",
        supported={
            "ppo": "sync_samples (or async_gradients)",
            "a2c": "sync_samples (or async_gradients)",
            "a3c": "async_gradients (or sync_samples)",
            "impala": "async_samples + V-trace (or sync_samples)",
            "dqn": "sync_replay, uniform or prioritized (or async_replay)",
            "apex": "async_replay: replay shard actors, per-worker epsilons (or sync_replay)",
            "sac": "sync_replay: twin Q critics, Polyak targets, learned temperature (or async_replay, uniform shards)",
            "dreamer": "sync_replay over a sequence buffer: world model (RSSM), actor and critic of the model_size "
            "preset, learned in imagination; recurrent acting",
        },
        multi_agent={
            "ppo": "sync_samples: a policy map in every evaluator, one sample batch per policy (IPPO)",
            "a2c": "sync_samples: a policy map in every evaluator, one sample batch per policy",
            "impala": "async_samples: the same policy map; each policy's V-trace on its own time-major sub-batch",
        },
        multi_agent_optimizers=("sync_samples", "async_samples"),
    ),
    "rllib": EngineInfo(
        id="rllib",
        target="crossrl.adapters.rllib:RllibAdapter",
        policy_loader="crossrl.adapters.rllib:load_policy",
        policy_exporter="crossrl.adapters.rllib:export_policy",
        description="Ray RLlib 2.60, new API stack, through AlgorithmConfig",
        supported={
            "ppo": "PPO: env runners sample synchronously, local learner",
            "impala": "IMPALA: async env runners, V-trace, learner sized to fit the CPUs",
            "dqn": "DQN: env runners + episode replay buffer",
            "sac": "SAC: env runners + episode replay buffer; critics as MLPs on [obs, action], uniform warm-up",
            "dreamer": "DreamerV3: RLlib's world model (RSSM), actor and critic of the model_size preset; env runners "
            "+ episode replay buffer, training_ratio replayed steps per env step",
        },
        unsupported={
            "a2c": "RLlib 2.60 has no A2C (removed from RLlib; rllib_contrib only)",
            "a3c": "RLlib 2.60 has no A3C (removed from RLlib; rllib_contrib only)",
            "apex": "RLlib 2.60 has no Ape-X DQN on the new API stack (removed)",
        },
        multi_agent={
            "ppo": "ParallelPettingZooEnv + one RLModule per policy (MultiRLModuleSpec, policy_mapping_fn), "
            "count_steps_by=env_steps; PPO per module (IPPO)",
        },
    ),
    "torchrl": EngineInfo(
        id="torchrl",
        target="crossrl.adapters.torchrl:TorchrlAdapter",
        policy_loader="crossrl.adapters.torchrl:load_policy",
        policy_exporter="crossrl.adapters.torchrl:export_policy",
        multi_agent_target="crossrl.adapters.torchrl:TorchrlMultiAgentAdapter",
        description="TorchRL 0.14: collectors, losses and value estimators",
        supported={
            "ppo": "ClipPPOLoss + GAE; Collector / MultiSyncCollector",
            "a2c": "A2CLoss + GAE; Collector / MultiSyncCollector",
            "a3c": "A2CLoss + GAE; MultiAsyncCollector (asynchronous collection)",
            "impala": "A2C-style loss with the VTrace value estimator; MultiAsyncCollector",
            "dqn": "DQNLoss + uniform ReplayBuffer",
            "sac": "SACLoss (twin Q critics, TD0, SoftUpdate targets, learned temperature) + uniform ReplayBuffer; "
            "Collector / MultiSyncCollector, init_random_frames until learning_starts",
            "dreamer": "DreamerV3 from TorchRL's RSSMPriorV3 / RSSMPosteriorV3 (block GRU), DreamerV3ModelLoss, "
            "ActorLoss (DreamerEnv imagination) and ValueLoss of the model_size preset; SliceSampler sequence replay "
            "at training_ratio; recurrent acting (RSSMStateEstimatorV3, TensorDictPrimer)",
        },
        unsupported={
            "apex": "TorchRL's prioritized replay needs its C++ extension, which does not load with torch 2.13",
        },
        # DreamerV3DiscreteActor, or a Gaussian mapped to the env's bounds
        action_spaces={"dreamer": ("Discrete", "Box (bounded)")},
        multi_agent={
            "ppo": "PettingZooWrapper (a group per policy) + MultiAgentMLP(share_params=True); ClipPPOLoss + GAE per "
            "policy (IPPO)",
            "a2c": "PettingZooWrapper (a group per policy) + MultiAgentMLP(share_params=True); A2CLoss + GAE per policy",
        },
    ),
}


assert tuple(BUILTIN) == ENGINES, "scenarios/catalog.py ENGINES and the registry's built-in engines differ"


def _extra_engines() -> dict[str, EngineInfo]:
    spec = os.environ.get("CROSSRL_EXTRA_ENGINES", "").strip()
    out: dict[str, EngineInfo] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        engine_id, sep, target = item.partition("=")
        if not sep or ":" not in target:
            raise ValueError(f"CROSSRL_EXTRA_ENGINES: {item!r} must look like id=package.module:Class")
        cls = load_target(target)
        algorithms = getattr(cls, "algorithms", None) or {a: "plugin" for a in ALGORITHMS}
        out[engine_id] = EngineInfo(
            id=engine_id,
            target=target,
            description=(cls.__doc__ or "extra engine").strip().splitlines()[0],
            supported=dict(algorithms),
            builtin=False,
        )
    return out


def engines() -> dict[str, EngineInfo]:
    return {**BUILTIN, **_extra_engines()}


def engine_info(engine_id: str) -> EngineInfo:
    return engines()[engine_id]


def engine_ids() -> list[str]:
    return list(engines())


def load_target(target: str) -> type:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]


def load_adapter(engine_id: str, *, multi_agent: bool = False):  # -> Adapter
    """Import the engine's adapter module (heavy) and return an instance: its ``multi_agent_target`` for a trial on
    a multi-agent env where it has one (TorchRL's multi-agent adapter builds on the single-agent module, which
    therefore cannot import it back), else its ``target``."""
    info = engines()[engine_id]
    return load_target(info.multi_agent_target if multi_agent and info.multi_agent_target else info.target)()


def unsupported(trials: Iterable[Trial]) -> list[tuple[Trial, str]]:
    """Trials an engine cannot run, with the reason and what the engine supports."""
    infos = engines()
    out = []
    for t in trials:
        info = infos[t.engine]
        reason = info.reason_unsupported_trial(t)
        if reason:
            out.append((t, f"{reason}; {t.engine} supports: {', '.join(info.supported)}"))
    return out


def require_supported(trials: Iterable[Trial]) -> None:
    """Raise SpecError listing every trial an engine cannot run (before anything starts)."""
    bad = unsupported(trials)
    if bad:
        raise SpecError(
            [f"{t.name}: {reason}" for t, reason in bad]
            + ["(run with --skip-unsupported to record these trials as SKIPPED and run the others)"]
        )
