"""The scenario spec: a typed, validated, immutable model of one comparison.

A spec names an env, an algorithm with its hyperparameters and model, the engines to run it on,
the execution (workers, envs per worker, crossrl's optimizer), a budget, a target and seeds.
``trials()`` expands it into one :class:`Trial` per engine x workers x seed.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from crossrl.scenarios.catalog import (
    CROSSRL_SETTINGS,
    DEFAULT_OPTIMIZER,
    ENGINES,
    HYPERPARAM_DEFAULTS,
    NATURAL_SCALING,
    VALID_OPTIMIZERS,
    AlgorithmName,
    BatchScaling,
    scaled_hyperparams,
)

MAX_SEED = 2**31 - 1
"""The largest seed: engines add worker offsets to it and some seed generators take 32 bits at most."""
_STRICT = ConfigDict(extra="forbid", frozen=True)


Preprocessing = Literal["none", "atari", "minatar"]
# How crossrl's evaluators hand fragments to the driver (crossrl.core.transport): a socket each, or one Ray
# actor call per fragment. The same fragments either way.
Transport = Literal["calls", "stream"]
TRANSPORTS: tuple[str, ...] = get_args(Transport)
DEFAULT_TRANSPORT: Transport = "stream"

# The batched env each TorchRL collector worker steps: gymnasium's SyncVectorEnv of the spec's envs in GymWrapper
# (autoreset disabled, so TorchRL resets each env itself), TorchRL's own SerialEnv of one GymWrapper per env, or
# gymnasium's AsyncVectorEnv (a process per env). The same envs, seeds and steps either way.
TorchrlEnv = Literal["gym_sync", "SerialEnv", "gym_async"]
TORCHRL_ENVS: tuple[str, ...] = get_args(TorchrlEnv)
DEFAULT_TORCHRL_ENV: TorchrlEnv = "gym_sync"
# How each RLlib env runner vectorises its envs (gymnasium's VectorizeMode): one SyncVectorEnv, one AsyncVectorEnv
# (a process per env), or the env's own vector class (gymnasium's vector entry point: CartPole has one).
RllibVectorize = Literal["SYNC", "ASYNC", "VECTOR_ENTRY_POINT"]
RLLIB_VECTORIZE: tuple[str, ...] = get_args(RllibVectorize)
# A layout knob set to BEST takes the value `crossrl bench sampling --sweep` measured fastest for the env and the
# trial's envs (crossrl.measure.bench.best_layout; `crossrl run` resolves it, measuring a sweep first when none is stored).
BEST = "best"
TorchrlEnvChoice = Literal["gym_sync", "SerialEnv", "gym_async", "best"]
RllibVectorizeChoice = Literal["SYNC", "ASYNC", "VECTOR_ENTRY_POINT", "best"]

FRAME_SIZES: dict[str, tuple[int, int]] = {"atari": (84, 84), "minatar": (10, 10)}
"""The frames' height and width after each pixel preprocessing (what a conv stack sees)."""

_SUITE_PREFIXES: dict[str, Preprocessing] = {"ALE/": "atari", "MinAtar/": "minatar"}

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
"""What a scenario's, a table's and a policy group's name may be (it names runs, files and policies)."""
_GROUP_NAME = re.compile(NAME_PATTERN)


def close_matches(value: Any, choices: Iterable[str]) -> list[str]:
    """The ``choices`` close to a misspelt name (difflib's, case aside when nothing is close otherwise), best first."""
    if not isinstance(value, str) or not value:
        return []
    options = [c for c in choices if isinstance(c, str)]
    matches = difflib.get_close_matches(value, options, n=3, cutoff=0.6)
    if not matches:  # 'cartpole-v1' for CartPole-v1
        lowered = {c.lower(): c for c in options}
        matches = [lowered[m] for m in difflib.get_close_matches(value.lower(), list(lowered), n=3, cutoff=0.6)]
    return [] if value in matches else matches


def suggest(value: Any, choices: Iterable[str], *, prefix: str = "") -> str | None:
    """A suggestion ("did you mean X?", or "X or Y?") for a misspelt name, from ``choices``; None when none is close."""
    matches = close_matches(value, choices)
    return f"did you mean {' or '.join(prefix + m for m in matches)}?" if matches else None


class AgentGroups(BaseModel):
    """Named groups of agents, one policy per group, e.g. ``{groups: {adversary: [adversary_0], good: [agent_0,
    agent_1]}}``; each agent in exactly one group, and a group's agents share their observation and action spaces."""

    model_config = _STRICT

    groups: dict[str, tuple[str, ...]] = Field(
        description=(
            "group name (letters, digits, '_.-'; it names the group's policy) -> the env's agent ids that group's "
            "policy acts for"
        )
    )


AgentMapping = Literal["shared", "independent"] | AgentGroups
"""How a multi-agent env's agents map to policies (``EnvSpec.agents``)."""


class EnvSpec(BaseModel):
    """The environment: a gymnasium id (or a PettingZoo parallel env with ``agents``), its keyword arguments, its
    preprocessing and a simulated step cost."""

    model_config = _STRICT

    id: str = Field(
        description=(
            "gymnasium env id, e.g. CartPole-v1 (or 'module:Id' to import a module first); with agents set, a "
            "PettingZoo env module as 'package:module', e.g. mpe2:simple_spread_v3 (its parallel_env(**kwargs))"
        )
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="passed to gymnasium.make (or to the PettingZoo module's parallel_env)"
    )
    agents: AgentMapping | None = Field(
        default=None,
        description=(
            "a multi-agent env and its policy mapping: 'shared' (one policy acts for every agent; their spaces must "
            "be equal), 'independent' (one policy per agent, named by the agent's id) or {groups: {name: [agent "
            "ids]}} (one policy per group: every agent in exactly one group, a group's agents with equal "
            "observation and action spaces). Set, env.id names a PettingZoo parallel env; each agent gets its own "
            "reward; an episode ends when every agent is done. null (the default): a single-agent gymnasium env"
        ),
    )
    preprocessing: Preprocessing | None = Field(
        default=None,
        description=(
            "wrappers crossrl puts around the env, the same for every engine. 'atari': gymnasium.make with "
            "frameskip=1 (sticky actions as the id defines them: v5 repeats the last action with p=0.25), then "
            "AtariPreprocessing (up to 30 no-op starts, frame skip 4 with max-pooling of the last two frames, "
            "84x84 grayscale) and a 4-frame stack: uint8 frames [84, 84, 4]. 'minatar': MinAtar's boolean "
            "channels as uint8 frames [10, 10, C] of 0 and 255. 'none': the env as gymnasium.make builds it. "
            "null (the default): chosen from the id, 'atari' for ALE/..., 'minatar' for MinAtar/..., else 'none'"
        ),
    )
    reward_clip: bool | None = Field(
        default=None,
        description=(
            "train on the sign of each step's reward (-1, 0, +1; DQN's Atari setting) while the reported returns stay "
            "the game's raw scores, on every engine. null (the default): on with 'atari' preprocessing, else off. "
            "Single-agent envs only"
        ),
    )
    actions: Literal["unit", "env"] | None = Field(
        default=None,
        description=(
            "continuous (Box) actions as every engine's policy sees them: 'unit' rescales them to [-1, 1] "
            "(gymnasium's RescaleAction: one affine map to the env's bounds, the same on every engine, so that a "
            "tanh-squashed policy covers them exactly); 'env': the env's own bounds (an action outside them is "
            "clipped). null (the default): 'unit' for sac, else 'env'"
        ),
    )
    step_latency_ms: float = Field(
        default=0.0, ge=0, le=10_000, description="wall time added per env step (sleep: costs time, not CPU)"
    )
    nonfinite: Literal["error", "warn"] = Field(
        default="error",
        description=(
            "a NaN or infinite reward or observation from the env: 'error' (the default) ends the trial FAILED naming "
            "the value, where it was and the env step; 'warn' lets it through with one warning line per env copy"
        ),
    )

    @property
    def resolved_reward_clip(self) -> bool:
        """``reward_clip``, or the preprocessing's default when it is null (on for 'atari')."""
        if self.reward_clip is not None:
            return self.reward_clip
        return self.resolved_preprocessing == "atari"

    @property
    def resolved_preprocessing(self) -> Preprocessing:
        """``preprocessing``, or the one the id implies when it is null."""
        if self.preprocessing is not None:
            return self.preprocessing
        name = self.id.rpartition(":")[2]
        if self.agents is not None:
            return "none"
        return next((kind for prefix, kind in _SUITE_PREFIXES.items() if name.startswith(prefix)), "none")

    @property
    def multi_agent(self) -> bool:
        """Whether this is a PettingZoo parallel env whose agents map to policies (``agents`` is set)."""
        return self.agents is not None

    @field_validator("agents", mode="before")
    @classmethod
    def _agents_shape(cls, v: Any) -> Any:
        # Checked here in one message per problem kind, rather than by the union (which reports every branch).
        if v is None or v in ("shared", "independent"):
            return v
        form = "give 'shared', 'independent' or {groups: {name: [agent ids]}}"
        if not isinstance(v, dict):
            raise ValueError(f"{_brief(v)} is not a policy mapping; {form}")
        if set(v) != {"groups"}:
            raise ValueError(f"{_brief(v)} is not a policy mapping; {form}")
        groups = v["groups"]
        if not isinstance(groups, dict) or not groups:
            raise ValueError(f"groups: {_brief(groups)} must map group names to lists of agent ids; {form}")
        problems: list[str] = []
        owner: dict[str, str] = {}
        for name, members in groups.items():
            if not isinstance(name, str) or not _GROUP_NAME.match(name):
                problems.append(f"group name {_brief(name)} must be letters, digits and '_.-' (it names a policy)")
                continue
            if not isinstance(members, list | tuple) or not members or not all(isinstance(a, str) for a in members):
                problems.append(f"group {name!r}: {_brief(members)} must be a non-empty list of agent ids")
                continue
            seen: set[str] = set()
            for agent in members:
                if agent in seen:
                    problems.append(f"agent {agent!r} is twice in group {name!r}; list it once")
                elif agent in owner:
                    problems.append(
                        f"agent {agent!r} is in groups {owner[agent]!r} and {name!r}; an agent is in exactly one group"
                    )
                seen.add(agent)
                owner.setdefault(agent, name)
        if problems:
            raise ValueError("\n".join(problems))  # one line each: the loader splits them
        return v

    @model_validator(mode="after")
    def _single_agent_preprocessing(self) -> EnvSpec:
        if self.agents is not None and self.preprocessing not in (None, "none"):
            raise ValueError(
                f"preprocessing: {self.preprocessing!r} is for single-agent gymnasium envs; a multi-agent env (agents "
                "set) takes 'none' or null"
            )
        if self.agents is not None and self.reward_clip:
            raise ValueError(
                "reward_clip: true is for single-agent envs; a multi-agent env (agents set) trains on its raw rewards: "
                "remove reward_clip or set it to false"
            )
        return self

    def policy_groups(self, agents: Sequence[str]) -> dict[str, tuple[str, ...]]:
        """Policy id -> the agents it acts for, in the env's agent order (``agents``: its ``possible_agents``).

        'shared': one policy ``shared``; 'independent': one per agent, named by the agent's id; groups as given.
        Assumes :func:`mapping_problems` found none.
        """
        if self.agents == "shared":
            return {"shared": tuple(agents)}
        if self.agents == "independent":
            return {a: (a,) for a in agents}
        if isinstance(self.agents, AgentGroups):
            return dict(self.agents.groups)
        raise ValueError(f"{self.id}: not a multi-agent env (env.agents is null)")


def mapping_problems(env: EnvSpec, agents: Sequence[str], spaces: Mapping[str, tuple[Any, Any]]) -> list[str]:
    """What is wrong with ``env.agents`` for an env with ``agents`` (its possible agents, in order) whose agent
    ``a`` has ``spaces[a] = (observation space, action space)``: one line per problem, each naming the field.

    An agent the env does not have, an agent in no group, and a policy whose agents' spaces differ (one
    policy has one observation and one action space) are found here; the mapping's own shape (an agent in
    two groups, names) is checked when the spec loads.
    """
    if env.agents is None:
        return []
    known = set(agents)
    problems: list[str] = []
    if isinstance(env.agents, AgentGroups):
        for name, members in env.agents.groups.items():
            unknown = [a for a in members if a not in known]
            if unknown:
                problems.append(
                    f"env.agents: group {name!r}: {', '.join(map(repr, unknown))} "
                    f"{'is not an agent' if len(unknown) == 1 else 'are not agents'} of {env.id} (its agents: "
                    f"{', '.join(agents)})"
                )
        grouped = {a for members in env.agents.groups.values() for a in members}
        missing = [a for a in agents if a not in grouped]
        if missing:
            problems.append(
                f"env.agents: {', '.join(map(repr, missing))} {'is' if len(missing) == 1 else 'are'} in no group; every "
                "agent needs a policy: add each to a group"
            )
    for name, members in env.policy_groups(agents).items():
        present = [a for a in members if a in known]
        for a in present[1:]:
            for what, i in (("observation", 0), ("action", 1)):
                if spaces[a][i] != spaces[present[0]][i]:
                    whose = "'shared'" if env.agents == "shared" else f"group {name!r}"
                    problems.append(
                        f"env.agents: {whose} needs one {what} space, but {present[0]} has {spaces[present[0]][i]} "
                        f"and {a} has {spaces[a][i]}; put agents with different spaces in different groups"
                    )
                    break
            else:
                continue
            break
    return problems


def _brief(value: Any) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."


class ModelSpec(BaseModel):
    """The policy/value network every engine builds: an optional conv stack, then an MLP; same everywhere."""

    model_config = _STRICT

    conv: tuple[tuple[int, int, int], ...] = Field(
        default=(),
        description=(
            "conv layers before the hidden ones, each [filters, kernel, stride] (square kernel, no padding, the "
            "activation after each), then flattened; needs image observations [H, W, C], uint8 frames are "
            "scaled by 1/255 inside the model. Empty (the default): an MLP on the flat observation"
        ),
    )
    hidden: tuple[int, ...] = Field(default=(64, 64), description="hidden layer widths")
    activation: Literal["tanh", "relu"] = Field(default="tanh", description="after every conv and hidden layer")

    @field_validator("conv", mode="before")
    @classmethod
    def _conv_triples(cls, v: Any) -> Any:
        if not isinstance(v, list | tuple):
            return v  # pydantic names the type it wanted
        for i, layer in enumerate(v):
            if not isinstance(layer, list | tuple) or len(layer) != 3:
                raise ValueError(f"layer {i + 1} {layer!r}: give each layer as [filters, kernel, stride]")
        return v

    @field_validator("conv")
    @classmethod
    def _conv_positive(cls, v: tuple[tuple[int, int, int], ...]) -> tuple[tuple[int, int, int], ...]:
        for i, layer in enumerate(v):
            if any(x < 1 for x in layer):
                raise ValueError(f"layer {i + 1} {list(layer)}: filters, kernel and stride must each be >= 1")
        return v

    @field_validator("hidden")
    @classmethod
    def _positive(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or any(h < 1 for h in v):
            raise ValueError("every hidden layer width must be >= 1 and there must be at least one layer")
        return v


def conv_output_sizes(height: int, width: int, conv: tuple[tuple[int, int, int], ...]) -> list[tuple[int, int]]:
    """(height, width) after each conv layer (no padding: ``(n - kernel) // stride + 1``), possibly < 1."""
    out = []
    for _, kernel, stride in conv:
        height, width = (height - kernel) // stride + 1, (width - kernel) // stride + 1
        out.append((height, width))
    return out


def conv_problem(height: int, width: int, conv: tuple[tuple[int, int, int], ...]) -> str | None:
    """Why ``conv`` cannot run on ``height`` x ``width`` frames (it shrinks them below 1x1), or None."""
    prev = (height, width)
    for i, size in enumerate(conv_output_sizes(height, width, conv)):
        if min(size) < 1:
            return (
                f"layer {i + 1} {list(conv[i])} shrinks the {height}x{width} frames below 1x1 (its input is "
                f"{prev[0]}x{prev[1]}); use smaller kernels or strides, or fewer layers"
            )
        prev = size
    return None


# DreamerV3's model sizes as RLlib 2.60 accepts them (ray.rllib.algorithms.dreamerv3.utils): its debug sizes, then
# the paper's (Table B).
DreamerModelSize = Literal["nano", "micro", "mini", "XXS", "XS", "S", "M", "L", "XL"]


class Hyperparams(BaseModel):
    """Shared hyperparameter names; a missing one takes the algorithm's default (scenarios/catalog.py)."""

    model_config = _STRICT

    lr: float | None = Field(default=None, gt=0, description="learning rate")
    gamma: float | None = Field(default=None, ge=0, le=1, description="discount")
    gae_lambda: float | None = Field(default=None, ge=0, le=1, description="GAE lambda (DreamerV3: its return lambda)")
    clip: float | None = Field(default=None, gt=0, description="PPO ratio clip")
    vf_clip: float | None = Field(default=None, gt=0, description="PPO value clip")
    train_batch: int | None = Field(default=None, ge=1, description="env steps per SGD phase / replay batch")
    minibatch: int | None = Field(default=None, ge=1, description="SGD minibatch size (env steps)")
    epochs: int | None = Field(default=None, ge=1, description="SGD passes over each train batch")
    entropy_coeff: float | None = Field(default=None, ge=0)
    vf_coeff: float | None = Field(default=None, ge=0)
    grad_clip: float | None = Field(default=None, gt=0, description="global gradient norm clip")
    rollout_fragment: int | None = Field(default=None, ge=1, description="env steps per env per sample call")
    buffer_size: int | None = Field(default=None, ge=1, description="replay capacity (transitions)")
    learning_starts: int | None = Field(default=None, ge=0, description="env steps before learning")
    target_update: int | None = Field(default=None, ge=1, description="env steps between target syncs")
    n_step: int | None = Field(default=None, ge=1)
    epsilon_initial: float | None = Field(default=None, ge=0, le=1)
    epsilon_final: float | None = Field(default=None, ge=0, le=1)
    epsilon_timesteps: int | None = Field(default=None, ge=1, description="env steps of epsilon decay")
    replay_ratio: float | None = Field(default=None, gt=0, description="trained / sampled transitions")
    double_q: bool | None = None
    prioritized_replay: bool | None = None
    priority_alpha: float | None = Field(default=None, ge=0)
    priority_beta: float | None = Field(default=None, ge=0)
    num_replay_shards: int | None = Field(default=None, ge=1)
    vtrace_clip_rho: float | None = Field(default=None, gt=0)
    vtrace_clip_c: float | None = Field(default=None, gt=0)
    actor_lr: float | None = Field(default=None, gt=0, description="SAC, DreamerV3: the policy's learning rate")
    critic_lr: float | None = Field(
        default=None, gt=0, description="SAC: the Q networks' learning rate; DreamerV3: the critic's"
    )
    alpha_lr: float | None = Field(default=None, gt=0, description="SAC: the entropy temperature's learning rate")
    tau: float | None = Field(default=None, gt=0, le=1, description="SAC: Polyak step of the target Q networks")
    updates_per_step: float | None = Field(
        default=None, gt=0, description="SAC: gradient updates per env step (each on a train_batch replay batch)"
    )
    target_entropy: float | Literal["auto"] | None = Field(
        default=None, description="SAC: the policy entropy the temperature is learned toward; 'auto': -(action dims)"
    )
    initial_alpha: float | None = Field(default=None, gt=0, description="SAC: the entropy temperature at the start")
    model_size: DreamerModelSize | None = Field(
        default=None,
        description="DreamerV3: the size preset of every network (the paper's XS..XL, RLlib's smaller nano, micro, "
        "mini, XXS)",
    )
    training_ratio: float | None = Field(
        default=None, gt=0, description="DreamerV3: replayed env steps (B x T per update) per env step sampled"
    )
    batch_size_B: int | None = Field(default=None, ge=1, description="DreamerV3: sequences per replay batch")
    batch_length_T: int | None = Field(default=None, ge=1, description="DreamerV3: env steps per replayed sequence")
    horizon_H: int | None = Field(default=None, ge=1, description="DreamerV3: imagined steps per actor-critic rollout")
    world_model_lr: float | None = Field(default=None, gt=0, description="DreamerV3: the world model's learning rate")
    entropy_scale: float | None = Field(default=None, ge=0, description="DreamerV3: the actor loss's entropy scale")
    free_bits: float | None = Field(
        default=None,
        ge=0,
        description="DreamerV3: nats below which the KL (dynamics, representation) losses are clipped",
    )


class AlgorithmSpec(BaseModel):
    model_config = _STRICT

    name: AlgorithmName
    hyperparams: Hyperparams = Field(default_factory=Hyperparams)
    model: ModelSpec = Field(default_factory=ModelSpec)

    def resolved_hyperparams(self) -> dict[str, Any]:
        """The algorithm's defaults overlaid with what the spec sets (derived, never written back)."""
        given = self.hyperparams.model_dump(exclude_none=True)
        return {**HYPERPARAM_DEFAULTS[self.name], **given}

    def with_hyperparams(self, values: Mapping[str, Any]) -> AlgorithmSpec:
        """This algorithm with ``values`` over its hyperparameters (validated: ValidationError for a value out of its
        field's range)."""
        given = {**self.hyperparams.model_dump(exclude_none=True), **values}
        return self.model_copy(update={"hyperparams": Hyperparams.model_validate(given)})


class TorchrlLayout(BaseModel):
    """How TorchRL's collectors step a trial's envs (the collector class follows the algorithm)."""

    model_config = _STRICT

    env: TorchrlEnvChoice | None = Field(
        default=None,
        description="the batched env of each collector worker: gym_sync (gymnasium's SyncVectorEnv in GymWrapper), "
        "SerialEnv (TorchRL's, one GymWrapper per env) or gym_async (a process per env); null: gym_sync, TorchRL's "
        "fastest measured for the same envs (docs/layouts.md); best: the fastest of the three in the newest stored "
        "`crossrl bench sampling --sweep` of this env and envs (`crossrl run` measures one first when none is "
        "stored); multi-agent envs always run in SerialEnv",
    )


class RllibLayout(BaseModel):
    """How RLlib's env runners step a trial's envs (one runner per worker, envs_per_worker envs each)."""

    model_config = _STRICT

    vectorize: RllibVectorizeChoice = Field(
        default="SYNC",
        description="each env runner's vector env (gymnasium's VectorizeMode): SYNC, ASYNC (a process per env) or "
        "VECTOR_ENTRY_POINT (the env's own vector class, where it has one, e.g. CartPole); best: the fastest of "
        "them in the newest stored `crossrl bench sampling --sweep` of this env and envs (`crossrl run` measures "
        "one first when none is stored)",
    )


class LayoutSpec(BaseModel):
    """Each engine's execution layout for the same workers and envs: the same envs, seeds and env steps whatever is
    chosen, so not part of the fingerprint (trials in other layouts stay comparable); recorded in each trial's
    native config."""

    model_config = _STRICT

    rllib: RllibLayout = Field(default_factory=RllibLayout)
    torchrl: TorchrlLayout = Field(default_factory=TorchrlLayout)

    def for_engine(self, engine: str) -> dict[str, Any]:
        """One engine's layout as a Trial carries it ({} for an engine without layout knobs)."""
        part = getattr(self, engine, None)
        return part.model_dump(mode="json") if isinstance(part, BaseModel) else {}

    def best_engines(self) -> list[str]:
        """The engines whose layout names ``best`` (to be resolved before their trials run)."""
        return [engine for engine in ("rllib", "torchrl") if BEST in self.for_engine(engine).values()]


class ExecutionSpec(BaseModel):
    model_config = _STRICT

    workers: tuple[int, ...] = Field(default=(1,), description="worker counts to run, one trial set each")
    envs_per_worker: int = Field(default=1, ge=1, le=1024)
    optimizer: str | None = Field(default=None, description="crossrl's policy optimizer; null: the algorithm's")
    transport: Transport = Field(
        default=DEFAULT_TRANSPORT,
        description="how crossrl's evaluators hand fragments to the driver: a socket each (stream) or one Ray "
        "actor call per fragment (calls); the same fragments either way, so not part of the fingerprint",
    )
    layout: LayoutSpec = Field(
        default_factory=LayoutSpec,
        description="each engine's execution layout (TorchRL's batched env, RLlib's vectorisation); the same envs "
        "and steps in any of them, so not part of the fingerprint",
    )
    scaling: BatchScaling | None = Field(
        default=None,
        description="how the batch behaves as workers grow: strong, the train batch held fixed and split over the "
        "workers; weak, a batch per worker held fixed, so the train batch grows with them; null: the algorithm's own "
        "(strong for ppo, a2c and impala, weak for a3c, dqn, apex and sac)",
    )

    @field_validator("workers", mode="before")
    @classmethod
    def _listify(cls, v: Any) -> Any:
        return [v] if isinstance(v, int) else v

    @field_validator("workers")
    @classmethod
    def _workers_ok(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v:
            raise ValueError("at least one worker count is needed")
        bad = [w for w in v if w < 1 or w > 256]
        if bad:
            raise ValueError(f"worker counts must be 1..256, got {bad}")
        return v


TRAIN_SECONDS_SLACK = 600.0  # wall_seconds past train_seconds when a time-budgeted spec leaves it out
DEFAULT_STALL_SECONDS = 120.0
DEFAULT_MAX_WORKER_RESTARTS = 10


class BudgetSpec(BaseModel):
    """What a trial may spend: env steps, or training wall time (or both: whichever ends first)."""

    model_config = _STRICT

    env_steps: int | None = Field(
        default=None, ge=1, description="env steps sampled per trial (required unless train_seconds is given)"
    )
    train_seconds: float | None = Field(
        default=None,
        gt=0,
        description=(
            "training wall time per trial, counted from the end of the engine's set-up: the trial ends FINISHED at "
            "its first point past it (the reference comparison's 'score after one hour of training'); with env_steps too, "
            "whichever comes first"
        ),
    )
    wall_seconds: float = Field(
        default=900.0,
        gt=0,
        description=(
            "hard wall-clock limit per trial, set-up included: past it the trial is stopped as TIMEOUT "
            f"(default 900, or train_seconds + {TRAIN_SECONDS_SLACK:g} for a time budget)"
        ),
    )
    stop_at_target: bool = Field(
        default=False,
        description="end a trial at its first point whose episode_return_mean reaches target.episode_return_mean",
    )
    stall_seconds: float = Field(
        default=DEFAULT_STALL_SECONDS,
        gt=0,
        description=(
            "the stall watchdog: once the engine's set-up is done, a trial in which no env step happens anywhere for "
            f"this long ends FAILED 'no env step for N s', with its processes' Python stacks (default "
            f"{DEFAULT_STALL_SECONDS:g}; a learning phase that takes longer than this without sampling needs more)"
        ),
    )
    max_worker_restarts: int = Field(
        default=DEFAULT_MAX_WORKER_RESTARTS,
        ge=0,
        description=(
            "how many times a trial may restart a sampling worker whose process died (crossrl's core and RLlib "
            f"restart them; TorchRL does not): past it the trial ends FAILED (default {DEFAULT_MAX_WORKER_RESTARTS})"
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _guard_after_train_time(cls, data: Any) -> Any:
        if isinstance(data, dict) and "wall_seconds" not in data and isinstance(data.get("train_seconds"), int | float):
            data = {**data, "wall_seconds": float(data["train_seconds"]) + TRAIN_SECONDS_SLACK}
        return data

    @model_validator(mode="after")
    def _one_budget(self) -> BudgetSpec:
        if self.env_steps is None and self.train_seconds is None:
            raise ValueError("give env_steps, train_seconds or both: a trial needs a budget")
        if self.train_seconds is not None and self.wall_seconds <= self.train_seconds:
            raise ValueError(
                f"wall_seconds ({self.wall_seconds:g}) must exceed train_seconds ({self.train_seconds:g}): it is the "
                "hard limit past which a trial is a TIMEOUT; leave it out to get train_seconds + "
                f"{TRAIN_SECONDS_SLACK:g}"
            )
        return self


DEFAULT_CHECKPOINT_EVERY_S = 60.0
DEFAULT_CHECKPOINT_KEEP = 2


class CheckpointSpec(BaseModel):
    """When a trial writes a checkpoint (its engine's whole training state), so that ``crossrl run --resume`` continues
    it from there after a kill and ``crossrl evaluate`` reloads its policy."""

    model_config = _STRICT

    every_env_steps: int | None = Field(
        default=None, ge=1, description="a checkpoint each time this many env steps were sampled since the last one"
    )
    every_seconds: float | None = Field(
        default=DEFAULT_CHECKPOINT_EVERY_S,
        gt=0,
        description=(
            "a checkpoint each time this much training time passed since the last one (default "
            f"{DEFAULT_CHECKPOINT_EVERY_S:g}, unless every_env_steps is given alone; trials shorter than that write "
            "none but the final one); with every_env_steps too, whichever interval passes first; null for both to "
            "write none during training"
        ),
    )
    keep: int = Field(
        default=DEFAULT_CHECKPOINT_KEEP, ge=1, description="how many of a trial's newest checkpoints are kept on disk"
    )
    final: bool = Field(
        default=True,
        description="write one more when the trial ends FINISHED (what `crossrl evaluate` reloads)",
    )
    replay_buffer: bool = Field(
        default=True,
        description=(
            "sac: keep the replay buffer in checkpoints; false writes smaller, faster ones, and a trial resumed from "
            "one starts with an empty buffer, acts with its restored policy and makes no update until the buffer "
            "again holds learning_starts transitions"
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _env_steps_alone(cls, data: Any) -> Any:
        """every_env_steps given alone replaces the default time interval; given with every_seconds, both count."""
        if isinstance(data, dict) and data.get("every_env_steps") is not None and "every_seconds" not in data:
            data = {**data, "every_seconds": None}
        return data


def check_seeds(v: tuple[int, ...]) -> tuple[int, ...]:
    if not v:
        raise ValueError("at least one seed is needed")
    if any(s < 0 or s > MAX_SEED for s in v) or len(set(v)) != len(v):
        raise ValueError(f"seeds must be distinct and 0..{MAX_SEED}")
    return v


SCHEDULERS = ("random", "asha", "pbt")
SEARCH_METRICS = ("final_return", "steps_to_target")
DISTRIBUTIONS = ("loguniform", "uniform", "integer", "choice")


class Distribution(BaseModel):
    """One hyperparameter's range in a search: exactly one of ``loguniform: [low, high]``, ``uniform: [low, high]``,
    ``integer: [low, high]`` (both ends included) or ``choice: [a, b, ...]``."""

    model_config = _STRICT

    loguniform: tuple[float, float] | None = None
    uniform: tuple[float, float] | None = None
    integer: tuple[int, int] | None = None
    choice: tuple[float | int | bool, ...] | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Distribution:
        given = [k for k in DISTRIBUTIONS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(DISTRIBUTIONS)} (got {', '.join(given) or 'none'})")
        kind = given[0]
        if kind == "choice":
            if not self.choice:
                raise ValueError("choice: give at least one value")
            return self
        low, high = getattr(self, kind)
        if not low < high:
            raise ValueError(f"{kind}: low ({low:g}) must be below high ({high:g})")
        if kind == "loguniform" and low <= 0:
            raise ValueError(f"loguniform: low must be above 0 (got {low:g}); use uniform for ranges that reach 0")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in DISTRIBUTIONS if getattr(self, k) is not None)

    def sample(self, rng: Any) -> float | int | bool:
        """One value drawn with ``rng`` (a ``numpy.random.Generator``)."""
        kind = self.kind
        if kind == "choice":
            assert self.choice is not None
            return self.choice[int(rng.integers(len(self.choice)))]
        low, high = getattr(self, kind)
        if kind == "integer":
            return int(rng.integers(low, high + 1))
        if kind == "loguniform":
            return float(math.exp(rng.uniform(math.log(low), math.log(high))))
        return float(rng.uniform(low, high))


class AshaSpec(BaseModel):
    """Asynchronous successive halving (Ray Tune's ``AsyncHyperBandScheduler``) over env steps sampled."""

    model_config = _STRICT

    grace_env_steps: int | None = Field(
        default=None,
        ge=1,
        description="env steps every configuration runs before it may be stopped (default: a sixteenth of env_steps)",
    )
    reduction_factor: float = Field(
        default=4.0, gt=1, description="how many configurations a rung keeps one of (Ray Tune's default, 4)"
    )


class PbtSpec(BaseModel):
    """Population Based Training (Ray Tune's ``PopulationBasedTraining``), synchronous, over env steps sampled."""

    model_config = _STRICT

    interval_env_steps: int | None = Field(
        default=None,
        ge=1,
        description="env steps between exploit / explore decisions (default: a tenth of env_steps)",
    )
    quantile: float = Field(
        default=0.25, gt=0, le=0.5, description="the bottom fraction copies the top fraction (Ray Tune's default)"
    )
    factors: tuple[float, float] = Field(
        default=(0.8, 1.2), description="a copied continuous value is multiplied by one of these (Ray Tune's default)"
    )
    resample_probability: float = Field(
        default=0.25, ge=0, le=1, description="chance a copied value is drawn afresh instead (Ray Tune's default)"
    )


class SearchSpec(BaseModel):
    """What `crossrl tune` searches: the same space and the same budget for every engine, on tuning seeds apart from
    the test seeds its chosen configurations are then run on."""

    model_config = _STRICT

    space: dict[str, Distribution] = Field(
        description="shared hyperparameter names (algorithm.hyperparams) and their ranges, the same for every engine"
    )
    scheduler: Literal["random", "asha", "pbt"] = Field(
        default="asha", description="random (every configuration runs its whole budget), asha, or pbt"
    )
    configurations: int = Field(
        default=16, ge=1, le=1024, description="configurations per engine (the population's size under pbt)"
    )
    env_steps: int = Field(ge=1, description="env steps per configuration (the most under asha)")
    metric: Literal["final_return", "steps_to_target"] = Field(
        default="final_return",
        description="what picks the best configuration: final return (higher), or env steps to target (fewer)",
    )
    tuning_seeds: tuple[int, ...] = Field(
        default=(1_000_000,), description="seeds the search trains on, in turn per configuration"
    )
    test_seeds: tuple[int, ...] = Field(
        default=(0, 1, 2, 3, 4), description="seeds each engine's best configuration and the spec's own are run on"
    )
    sample_seed: int = Field(default=0, ge=0, le=MAX_SEED, description="which configurations are drawn")
    asha: AshaSpec = Field(default_factory=AshaSpec)
    pbt: PbtSpec = Field(default_factory=PbtSpec)

    @field_validator("space")
    @classmethod
    def _known_names(cls, v: dict[str, Distribution]) -> dict[str, Distribution]:
        known = list(Hyperparams.model_fields)
        bad = [k for k in v if k not in known]
        if bad:
            hints = [hint for b in bad if (hint := suggest(b, known))]
            raise ValueError(
                f"{', '.join(repr(b) for b in bad)} is not a shared hyperparameter name (algorithm.hyperparams)"
                + ("; " + "; ".join(hints) if hints else "")
            )
        if not v:
            raise ValueError("name at least one hyperparameter to search")
        return v

    @field_validator("tuning_seeds", "test_seeds")
    @classmethod
    def _seeds_ok(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        return check_seeds(v)

    @model_validator(mode="after")
    def _seeds_apart(self) -> SearchSpec:
        both = sorted(set(self.tuning_seeds) & set(self.test_seeds))
        if both:
            raise ValueError(
                f"tuning_seeds and test_seeds share {', '.join(map(str, both))}: a configuration chosen on a seed is "
                "not tested on it; make them disjoint"
            )
        return self

    @property
    def grace_env_steps(self) -> int:
        return self.asha.grace_env_steps or max(1, self.env_steps // 16)

    @property
    def interval_env_steps(self) -> int:
        return self.pbt.interval_env_steps or max(1, self.env_steps // 10)

    def sample(self) -> list[dict[str, Any]]:
        """The configurations (each a dict of the space's names), drawn with ``sample_seed``: the same for every
        engine, so each engine's search starts from the same points."""
        import numpy as np

        rng = np.random.default_rng(self.sample_seed)
        return [{name: dist.sample(rng) for name, dist in self.space.items()} for _ in range(self.configurations)]


class TargetSpec(BaseModel):
    model_config = _STRICT

    episode_return_mean: float | None = None


class RegressSpec(BaseModel):
    """Tolerances for `crossrl regress` (a change is flagged only when it beats both these and the noise)."""

    model_config = _STRICT

    throughput_drop: float = Field(
        default=0.15,
        gt=0,
        lt=1,
        description="largest allowed drop of sampling throughput (as a ratio to raw env speed)",
    )
    steps_to_target_growth: float = Field(
        default=0.25, gt=0, description="largest allowed growth of the median env steps to target"
    )
    final_return: bool = Field(
        default=True, description="check that the final-return IQM stays inside the baseline's CI or reaches the target"
    )


class ScenarioSpec(BaseModel):
    """One comparison. Immutable; derived values are computed, never written back."""

    model_config = _STRICT

    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    env: EnvSpec
    algorithm: AlgorithmSpec
    engines: tuple[str, ...] = ENGINES
    execution: ExecutionSpec = Field(default_factory=ExecutionSpec)
    budget: BudgetSpec
    target: TargetSpec = Field(default_factory=TargetSpec)
    seeds: tuple[int, ...] = (0,)
    regress: RegressSpec = Field(default_factory=RegressSpec, description="tolerances for `crossrl regress`")
    checkpoint: CheckpointSpec = Field(
        default_factory=CheckpointSpec,
        description="when trials write checkpoints (`crossrl run --resume`, `crossrl evaluate`)",
    )
    search: SearchSpec | None = Field(
        default=None, description="what `crossrl tune` searches (the scenario's own trials do not use it)"
    )
    native: dict[str, dict[str, dict[str, Any]]] = Field(
        default_factory=dict,
        description=(
            "engine-native settings, passed to the engine as written after crossrl's own (they win): engine -> "
            "section -> keyword arguments. rllib: AlgorithmConfig method -> its keyword arguments ({training: "
            "{vf_clip_param: 5.0}}); torchrl: loss, optimizer, collector -> keyword arguments of the loss class, "
            "torch.optim.Adam, the collector class; crossrl: settings -> crossrl's own settings beyond the shared "
            "hyperparameters (adam_eps, ...). They break the equal-settings rule: the report marks the engines that "
            "ran with them. A section for an engine the run leaves out (--engines) is unused"
        ),
    )

    @field_validator("engines")
    @classmethod
    def _engines_known(cls, v: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        # The ids a spec may name come in the validation context (the loader passes the engine registry's),
        # so the spec never imports the engines; without a context the built-in ones are the known ones.
        known = (info.context or {}).get("engines", ENGINES)
        bad = [e for e in v if e not in known]
        if bad:
            hints = [hint for b in bad if (hint := suggest(b, known))]
            raise ValueError(
                f"{', '.join(repr(b) for b in bad)} is not one of {', '.join(known)}{'; ' if hints else ''}"
                + "; ".join(hints)
            )
        if not v:
            raise ValueError("at least one engine is needed")
        if len(set(v)) != len(v):
            raise ValueError("engines are listed twice")
        return v

    @field_validator("seeds")
    @classmethod
    def _seeds_ok(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        return check_seeds(v)

    @model_validator(mode="after")
    def _sections_agree(self, info: ValidationInfo) -> ScenarioSpec:
        problems = cross_field_problems(env=self.env, algorithm=self.algorithm, execution=self.execution)
        known = (info.context or {}).get("engines", ENGINES)
        problems += native_problems(self.native, algorithm=self.algorithm.name, engines=known)
        if not self.checkpoint.replay_buffer and self.algorithm.name != "sac":
            problems.append(
                f"checkpoint.replay_buffer: false applies to sac only ({self.algorithm.name} keeps "
                f"{'its replay buffer' if self.algorithm.name in ('dqn', 'apex') else 'no replay buffer'} in every "
                "checkpoint): remove it or set it to true"
            )
        if self.search is not None:
            problems += search_problems(self.search, algorithm=self.algorithm, target=self.target)
        if problems:
            raise ValueError("\n".join(problems))  # one line each: the loader splits them
        return self

    @property
    def optimizer(self) -> str:
        """crossrl's policy optimizer for this spec (the algorithm's default when not set)."""
        return self.execution.optimizer or DEFAULT_OPTIMIZER[self.algorithm.name]

    @property
    def batch_scaling(self) -> BatchScaling:
        """Strong or weak scaling of the batch (``execution.scaling``; the algorithm's own when not set)."""
        return self.execution.scaling or NATURAL_SCALING[self.algorithm.name]

    def canonical(self) -> dict[str, Any]:
        """What determines a trial's conditions: everything but labels and the trial axes.

        Engines, worker counts and seeds choose *which* trials run; they are left out so that a run
        restricted with ``--engines``/``--workers``/``--seeds`` stays comparable with the full one. So is when
        checkpoints are written (their cost is left out of training time).
        """
        data = self.model_dump(
            mode="json", exclude={"name", "description", "engines", "seeds", "regress", "checkpoint", "search"}
        )
        if not data["native"]:  # left out when empty: fingerprints from before the field still match
            data.pop("native")
        data["algorithm"]["hyperparams"] = self.algorithm.resolved_hyperparams()
        data["execution"].pop("workers")
        data["execution"].pop("transport")  # how fragments travel, not what is sampled
        data["execution"].pop("layout")  # how each engine steps the same envs, likewise
        data["execution"]["optimizer"] = self.optimizer
        data["execution"].pop("scaling")
        if self.batch_scaling != NATURAL_SCALING[self.algorithm.name]:  # at the algorithm's own, fingerprints hold
            data["execution"]["scaling"] = self.batch_scaling
        if not self.budget.stop_at_target:
            # Added after baselines existed: left out at its default so their fingerprints still match.
            data["budget"].pop("stop_at_target")
        if self.budget.train_seconds is None:  # likewise
            data["budget"].pop("train_seconds")
        # How a trial fails (the stall watchdog, the restart bound, the non-finite switch at its default) is no
        # condition of what it measures.
        data["budget"].pop("stall_seconds")
        data["budget"].pop("max_worker_restarts")
        if self.env.nonfinite == "error":
            data["env"].pop("nonfinite")
        # Likewise the pixel fields: the preprocessing as resolved (a null one and the one it resolves to
        # are the same conditions), left out when it is "none"; the conv stack left out when empty.
        data["env"].pop("preprocessing")
        if self.env.agents is None:  # the multi-agent mapping, likewise left out for single-agent envs
            data["env"].pop("agents")
        if self.env.resolved_preprocessing != "none":
            data["env"]["preprocessing"] = self.env.resolved_preprocessing
        # Reward clipping likewise as resolved, left out when off (every run before it trained on raw rewards).
        data["env"].pop("reward_clip")
        if self.env.resolved_reward_clip:
            data["env"]["reward_clip"] = True
        # The action scale likewise as resolved (sac: 'unit'), left out at 'env' (every run before it).
        data["env"].pop("actions")
        actions = self.env.actions or ("unit" if self.algorithm.name == "sac" else "env")
        if actions != "env":
            data["env"]["actions"] = actions
        if not self.algorithm.model.conv:
            data["algorithm"]["model"].pop("conv")
        return data

    def fingerprint(self) -> str:
        """sha256 (first 16 hex digits) of the canonical JSON form."""
        blob = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def trials(self, *, ray_address: str | None = None) -> list[Trial]:
        """engines x workers x seeds, in that nesting order (engines interleave inside a seed)."""
        fp = self.fingerprint()
        hp = self.algorithm.resolved_hyperparams()
        return [
            Trial(
                scenario=self.name,
                fingerprint=fp,
                engine=engine,
                algorithm=self.algorithm.name,
                optimizer=self.optimizer,
                transport=self.execution.transport,
                layout=self.execution.layout.for_engine(engine),
                hyperparams=scaled_hyperparams(self.algorithm.name, hp, self.batch_scaling, workers),
                batch_scaling=self.batch_scaling,
                model=self.algorithm.model,
                env=self.env,
                workers=workers,
                envs_per_worker=self.execution.envs_per_worker,
                seed=seed,
                budget=self.budget,
                target_return=self.target.episode_return_mean,
                ray_address=ray_address,
                checkpoint=self.checkpoint,
                native=self.native.get(engine, {}),
            )
            for workers in self.execution.workers
            for seed in self.seeds
            for engine in self.engines
        ]

    def with_config(
        self,
        config: Mapping[str, Any],
        *,
        seeds: Sequence[int] | None = None,
        engines: Sequence[str] | None = None,
        env_steps: int | None = None,
    ) -> ScenarioSpec:
        """This scenario with ``config`` over its hyperparameters (a search's configuration), and other seeds, engines
        or an env-step budget (then without a training-time one) when given."""
        update: dict[str, Any] = {"algorithm": self.algorithm.with_hyperparams(config)}
        if seeds is not None:
            update["seeds"] = tuple(seeds)
        if engines is not None:
            update["engines"] = tuple(engines)
        if env_steps is not None:
            update["budget"] = self.budget.model_copy(update={"env_steps": env_steps, "train_seconds": None})
        return self.model_copy(update=update)

    def search_trials(self, engine: str, *, ray_address: str | None = None) -> list[Trial]:
        """The search's trials on ``engine``: configuration i (``search.sample()``) on tuning seed i mod their count,
        at the first worker count, for ``search.env_steps``; labelled ``c<i>``."""
        if self.search is None:
            raise ValueError(f"scenario {self.name!r} has no search section")
        seeds = self.search.tuning_seeds
        out = []
        for index, config in enumerate(self.search.sample()):
            spec = self.with_config(
                config, seeds=[seeds[index % len(seeds)]], engines=[engine], env_steps=self.search.env_steps
            )
            out.append(spec.trials(ray_address=ray_address)[0].model_copy(update={"label": f"c{index:02d}"}))
        return out


def cross_field_problems(
    *, env: EnvSpec | None = None, algorithm: AlgorithmSpec | None = None, execution: ExecutionSpec | None = None
) -> list[str]:
    """What is wrong between a scenario's sections, one line per problem naming the field: each check runs when the
    sections it reads are given (the loader gives those that validate alone, so a spec's other mistakes do not
    hide these).

    crossrl's optimizer against the algorithm; a conv stack against the pixel preprocessing's frames (other image
    envs are checked once the env is built: ``crossrl validate``, and crossrl.core.models); batch sizes against
    each other.
    """
    problems: list[str] = []
    if algorithm is not None and execution is not None:
        opt = execution.optimizer
        valid = VALID_OPTIMIZERS[algorithm.name]
        if opt is not None and opt not in valid:
            hint = suggest(opt, valid)
            problems.append(
                f"execution.optimizer: {opt!r} cannot run {algorithm.name}; valid: {', '.join(valid)}"
                + (f"; {hint}" if hint else "")
            )
        if algorithm.name == "dreamer" and execution.scaling not in (None, NATURAL_SCALING["dreamer"]):
            problems.append(
                "execution.scaling: dreamer holds its training_ratio (replayed per sampled env step) and its B x T "
                "batches whatever the workers; only its own 'weak' scaling applies: remove execution.scaling"
            )
    if env is not None and algorithm is not None:
        size = FRAME_SIZES.get(env.resolved_preprocessing)
        problem = conv_problem(*size, algorithm.model.conv) if size else None
        if problem:
            problems.append(f"algorithm.model.conv: {problem} ({env.id})")
    if algorithm is not None:
        problems += batch_problems(algorithm)
    if env is not None and execution is not None and env.multi_agent:
        chosen = execution.layout.torchrl.env
        if chosen not in (None, "SerialEnv"):
            problems.append(
                f"execution.layout.torchrl.env: {chosen!r} is for single-agent envs; TorchRL steps a multi-agent env "
                "(env.agents) in SerialEnv: leave it out"
            )
        if execution.layout.rllib.vectorize != "SYNC":
            problems.append(
                f"execution.layout.rllib.vectorize: {execution.layout.rllib.vectorize!r} is for single-agent envs; "
                "RLlib steps a multi-agent env one per env runner: leave it out"
            )
    return problems


def batch_problems(algorithm: AlgorithmSpec) -> list[str]:
    """Batch sizes that contradict each other, with the algorithm's defaults filled in: an SGD minibatch larger than
    the train batch it is cut from (RLlib's config check refuses it), a replay batch larger than the replay buffer it
    is drawn from."""
    hp = algorithm.resolved_hyperparams()
    given = algorithm.hyperparams.model_dump(exclude_none=True)

    def clash(small: str, large: str, what: str) -> str:
        # Named by the field the spec sets (the other one may be the algorithm's default).
        def value(key: str) -> str:
            return f"{hp[key]}" if key in given else f"{hp[key]}, {algorithm.name}'s default"

        if large in given or small not in given:
            return (
                f"algorithm.hyperparams.{large}: {hp[large]} is larger than {small} ({value(small)}); {what}: make "
                f"{large} at most {small}"
            )
        return (
            f"algorithm.hyperparams.{small}: {hp[small]} is smaller than {large} ({value(large)}); {what}: make "
            f"{large} at most {small}"
        )

    problems = []
    minibatch, train_batch = hp.get("minibatch"), hp.get("train_batch")
    replay = algorithm.name in ("dqn", "apex")  # no SGD minibatches: one replay batch per gradient step
    if not replay and minibatch is not None and train_batch is not None and minibatch > train_batch:
        problems.append(clash("train_batch", "minibatch", "a minibatch is cut from the train batch"))
    buffer = hp.get("buffer_size")
    if replay and buffer is not None and train_batch is not None and train_batch > buffer:
        problems.append(clash("buffer_size", "train_batch", "a replay batch is drawn from the replay buffer"))
    return problems


def search_problems(search: SearchSpec, *, algorithm: AlgorithmSpec, target: TargetSpec) -> list[str]:
    """What is wrong between a search and the scenario it tunes, one line each: env steps to target without a target;
    a drawn configuration the algorithm cannot run (a value outside its field's range, batch sizes that clash)."""
    problems = []
    if search.metric == "steps_to_target" and target.episode_return_mean is None:
        problems.append(
            "search.metric: steps_to_target needs target.episode_return_mean; set the target or use final_return"
        )
    for index, config in enumerate(search.sample()):
        try:
            tuned = algorithm.with_hyperparams(config)
        except ValidationError as e:
            for err in e.errors():
                where = ".".join(str(x) for x in err["loc"])
                problems.append(
                    f"search.space.{where}: configuration {index} drew {config.get(str(err['loc'][-1]))!r}: "
                    f"{err['msg']}; narrow the range"
                )
            break
        clash = batch_problems(tuned)
        if clash:
            problems += [f"search.space: configuration {index} ({_brief(config)}): {line}" for line in clash]
            break
    return problems


# The sections of each built-in engine's ``native`` part (rllib: any AlgorithmConfig method, checked against RLlib
# itself by `crossrl validate`: crossrl.orchestration.probes).
NATIVE_SECTIONS: dict[str, tuple[str, ...]] = {
    "crossrl": ("settings",),
    "torchrl": ("loss", "optimizer", "collector"),
}


def native_problems(native: Mapping[str, Any], *, algorithm: str, engines: Iterable[str] = ENGINES) -> list[str]:
    """What is wrong in a spec's ``native`` section that needs no engine to tell, one line each naming the key: an
    engine that does not exist, a section the engine has not, crossrl's own settings the algorithm has not. The
    keyword arguments RLlib's and TorchRL's classes take are checked against the classes at `crossrl validate`
    (crossrl.orchestration.probes)."""
    known = tuple(engines)
    problems: list[str] = []
    for engine, sections in native.items():
        if engine not in known:
            hint = suggest(engine, known)
            problems.append(
                f"native.{engine}: {engine!r} is no engine (engines: {', '.join(known)})"
                + (f"; {hint}" if hint else "; name an engine, or remove the section")
            )
            continue
        allowed = NATIVE_SECTIONS.get(engine)
        for name, kwargs in sections.items():
            where = f"native.{engine}.{name}"
            if allowed is not None and name not in allowed:
                hint = suggest(name, allowed)
                problems.append(
                    f"{where}: {engine} has no native section {name!r}; its sections: {', '.join(allowed)}"
                    + (f"; {hint}" if hint else "")
                )
                continue
            if engine == "crossrl":
                own = [k for k in CROSSRL_SETTINGS[algorithm] if k not in Hyperparams.model_fields]
                for key in kwargs:
                    if key in Hyperparams.model_fields:
                        problems.append(
                            f"{where}.{key}: {key} is a shared hyperparameter; set it in algorithm.hyperparams "
                            "(every engine then gets it)"
                        )
                    elif key not in own:
                        hint = suggest(key, own)
                        problems.append(
                            f"{where}.{key}: crossrl's {algorithm} has no setting {key!r}; its settings: "
                            f"{', '.join(own)}" + (f"; {hint}" if hint else "")
                        )
    return problems


def native_text(native: Mapping[str, Mapping[str, Any]]) -> str:
    """One engine's native settings on one line, e.g. ``training.vf_clip_param=5.0, env_runners.x=64`` (the trial's
    ``native.overrides`` tag, the report's note)."""
    return ", ".join(
        f"{section}.{key}={json.dumps(value, default=str)}"
        for section, kwargs in native.items()
        for key, value in kwargs.items()
    )


class Trial(BaseModel):
    """One engine x workers x seed run of a scenario; what an adapter receives (JSON-serializable)."""

    model_config = _STRICT

    scenario: str
    fingerprint: str
    engine: str
    algorithm: AlgorithmName
    optimizer: str
    hyperparams: dict[str, Any]
    model: ModelSpec
    env: EnvSpec
    workers: int
    envs_per_worker: int
    seed: int
    budget: BudgetSpec
    target_return: float | None = None
    ray_address: str | None = None
    transport: Transport = DEFAULT_TRANSPORT  # crossrl only
    layout: dict[str, Any] = Field(default_factory=dict)  # this engine's part of execution.layout (rllib, torchrl)
    batch_scaling: BatchScaling = "strong"  # execution.scaling as resolved; hyperparams already scaled by it
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    # This engine's part of the spec's ``native`` section (section -> keyword arguments), applied after crossrl's own
    # settings; empty for a trial that follows the equal-settings rule.
    native: dict[str, dict[str, Any]] = Field(default_factory=dict)
    # Set by the runner: the folder this trial's checkpoints go to, and the checkpoint it continues from (--resume).
    checkpoint_dir: str | None = None
    resume_from: str | None = None
    label: str = ""  # a search's configuration (``c03``): trials of one seed apart
    # Population Based Training's exploit: resume_from is another trial's checkpoint; the trial keeps its own random
    # streams (seeded from its seed and the checkpoint's env step) instead of taking the other trial's.
    resume_copy: bool = False

    @model_validator(mode="before")
    @classmethod
    def _resolve_actions(cls, data: Any) -> Any:
        """``env.actions`` left null becomes the algorithm's choice ('unit' for sac: a tanh-squashed policy), so
        that every process building the trial's env (``make_env(trial.env)``) builds the same one."""
        if not isinstance(data, dict) or data.get("algorithm") != "sac":
            return data
        env = data.get("env")
        if isinstance(env, EnvSpec) and env.actions is None:
            return {**data, "env": env.model_copy(update={"actions": "unit"})}
        if isinstance(env, dict) and env.get("actions") is None:
            return {**data, "env": {**env, "actions": "unit"}}
        return data

    @property
    def name(self) -> str:
        """Like ``rllib-ppo-w2-s0`` (``rllib-ppo-w2-s0-c03`` for a search's configuration 3)."""
        base = f"{self.engine}-{self.algorithm}-w{self.workers}-s{self.seed}"
        return f"{base}-{self.label}" if self.label else base

    def hp(self, key: str) -> Any:
        """A resolved hyperparameter; a KeyError names the algorithm when it has no such default."""
        try:
            return self.hyperparams[key]
        except KeyError:
            raise KeyError(f"hyperparameter {key!r} has no value for {self.algorithm}") from None
