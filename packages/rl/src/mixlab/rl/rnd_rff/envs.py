"""Exploration tasks: ``CoordMaze`` (NumPy-vectorised rooms and doorways) and MiniGrid.

CoordMaze is one maze under two encodings of the same state: ``obs="xy"`` gives the normalised
(row, col) position, where nearby cells have nearby observations and a smooth target lets a
predictor extrapolate novelty away (the regime the method targets); ``obs="onehot"`` gives the
cell as a one-hot vector, where every cell is equally far from every other (the control). The
agent starts in the top-left corner of the first room; reward 1 and termination come only in
the far corner of the last room.

Every env here reports ``info["cell"]``, an integer id of the agent's cell, so a learner can
count the cells it has visited.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from mixlab.shared.config import is_count, require

OBS_KINDS = ("xy", "onehot")
MOVES = np.array([[-1, 0], [1, 0], [0, -1], [0, 1]])  # up, down, left, right
ENV_ID = "mixlab/CoordMaze-v0"

__all__ = [
    "ENV_ID",
    "OBS_KINDS",
    "CellInfo",
    "CoordMaze",
    "CoordMazeVector",
    "MazeLayout",
    "make_vector_env",
]


class MazeLayout:
    """A ``rooms = (rows, cols)`` grid of square rooms of ``room_size`` cells, walls one cell
    thick, each pair of neighbouring rooms joined by a one-cell doorway in the middle of their
    wall. ``free[r, c]`` marks walkable cells; ``cell[r, c]`` numbers them (−1 on walls)."""

    def __init__(self, rooms: tuple[int, int] = (1, 4), room_size: int = 5) -> None:
        rows, cols = (int(r) for r in rooms)
        if rows < 1 or cols < 1 or rows * cols < 2:
            raise ValueError(
                f"rooms must be (rows, cols) of integers >= 1 with at least 2 rooms, got {rooms}"
            )
        require(is_count(room_size, 2), "room_size", "an integer >= 2", room_size)
        step = room_size + 1
        height, width = rows * step + 1, cols * step + 1
        free = np.zeros((height, width), bool)
        for r in range(rows):
            for c in range(cols):
                free[1 + r * step : (r + 1) * step, 1 + c * step : (c + 1) * step] = True
                middle = room_size // 2
                if c + 1 < cols:  # doorway to the room on the right
                    free[1 + r * step + middle, (c + 1) * step] = True
                if r + 1 < rows:  # doorway to the room below
                    free[(r + 1) * step, 1 + c * step + middle] = True
        self.rooms, self.room_size, self.free = (rows, cols), room_size, free
        self.cell = np.full(free.shape, -1, np.int64)
        self.cell[free] = np.arange(free.sum())
        self.n_cells = int(free.sum())
        self.start = np.array([1, 1])
        self.goal = np.array([height - 2, width - 2])

    @property
    def shape(self) -> tuple[int, int]:
        return self.free.shape  # type: ignore[return-value]

    def move(self, positions: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """Positions after ``actions``; a move into a wall leaves the agent where it is."""
        moved = positions + MOVES[actions]
        blocked = ~self.free[moved[:, 0], moved[:, 1]]
        return np.where(blocked[:, None], positions, moved)

    def observe(self, positions: np.ndarray, kind: str) -> np.ndarray:
        if kind == "xy":
            return (positions / (np.array(self.shape) - 1)).astype(np.float32)
        obs = np.zeros((len(positions), self.n_cells), np.float32)
        obs[np.arange(len(positions)), self.cell[positions[:, 0], positions[:, 1]]] = 1.0
        return obs

    def observation_space(self, kind: str) -> gym.spaces.Box:
        if kind not in OBS_KINDS:
            raise ValueError(f"obs must be one of {list(OBS_KINDS)}, got {kind!r}")
        size = 2 if kind == "xy" else self.n_cells
        return gym.spaces.Box(0.0, 1.0, (size,), np.float32)


def _default_max_steps(layout: MazeLayout) -> int:
    return 4 * layout.n_cells


class CoordMaze(gym.Env):
    """One CoordMaze (see the module docstring); ``max_steps`` defaults to 4 × the free cells."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"]}

    def __init__(
        self,
        rooms: tuple[int, int] = (1, 4),
        room_size: int = 5,
        obs: str = "xy",
        max_steps: int | None = None,
        render_mode: str | None = None,
    ) -> None:
        self.layout = MazeLayout(rooms, room_size)
        self.observation_space = self.layout.observation_space(obs)
        self.action_space = gym.spaces.Discrete(4)
        self.kind, self.render_mode = obs, render_mode
        self.max_steps = max_steps or _default_max_steps(self.layout)
        self.position, self.steps = self.layout.start.copy(), 0

    def _obs(self) -> np.ndarray:
        return self.layout.observe(self.position[None], self.kind)[0]

    def _info(self) -> dict[str, Any]:
        return {"cell": int(self.layout.cell[tuple(self.position)])}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.position, self.steps = self.layout.start.copy(), 0
        return self._obs(), self._info()

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"action must be in {{0, 1, 2, 3}}, got {action!r}")
        self.position = self.layout.move(self.position[None], np.array([action]))[0]
        self.steps += 1
        terminated = bool((self.position == self.layout.goal).all())
        truncated = not terminated and self.steps >= self.max_steps
        return self._obs(), float(terminated), terminated, truncated, self._info()

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        grid = np.where(self.layout.free, ".", "#").astype("<U1")
        grid[tuple(self.layout.goal)], grid[tuple(self.position)] = "G", "A"
        return "\n".join("".join(row) for row in grid)


class CoordMazeVector(gym.vector.VectorEnv):
    """``num_envs`` CoordMazes stepped together in NumPy, resetting a finished env in the same
    step (gymnasium's ``SAME_STEP`` mode: for a finished env ``obs`` and ``info["cell"]`` are the
    reset's, the terminal ones are in ``info["final_obs"]`` and ``info["final_info"]``).
    ``visits`` counts every cell the envs have occupied since construction."""

    metadata: ClassVar[dict[str, Any]] = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}

    def __init__(
        self,
        num_envs: int = 8,
        rooms: tuple[int, int] = (1, 4),
        room_size: int = 5,
        obs: str = "xy",
        max_steps: int | None = None,
    ) -> None:
        require(is_count(num_envs), "num_envs", "an integer >= 1", num_envs)
        self.layout = MazeLayout(rooms, room_size)
        self.kind, self.num_envs = obs, num_envs
        self.single_observation_space = self.layout.observation_space(obs)
        self.single_action_space = gym.spaces.Discrete(4)
        self.observation_space = gym.vector.utils.batch_space(
            self.single_observation_space, num_envs
        )
        self.action_space = gym.spaces.MultiDiscrete(np.full(num_envs, 4))
        self.max_steps = max_steps or _default_max_steps(self.layout)
        self.positions = np.tile(self.layout.start, (num_envs, 1))
        self.steps = np.zeros(num_envs, np.int64)
        self.visits = np.zeros(self.layout.n_cells, np.int64)

    def _cells(self) -> np.ndarray:
        return self.layout.cell[self.positions[:, 0], self.positions[:, 1]]

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.positions[:] = self.layout.start
        self.steps[:] = 0
        cells = self._cells()
        np.add.at(self.visits, cells, 1)
        return self.layout.observe(self.positions, self.kind), {"cell": cells}

    def step(self, actions):
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs,) or not np.isin(actions, (0, 1, 2, 3)).all():
            raise ValueError(
                f"actions must be {self.num_envs} integers in {{0, 1, 2, 3}}, got {actions!r}"
            )
        self.positions = self.layout.move(self.positions, actions)
        self.steps += 1
        cells = self._cells()
        np.add.at(self.visits, cells, 1)
        terminated = (self.positions == self.layout.goal).all(1)
        truncated = ~terminated & (self.steps >= self.max_steps)
        rewards = terminated.astype(np.float32)
        obs = self.layout.observe(self.positions, self.kind)
        info: dict[str, Any] = {"cell": cells}
        done = terminated | truncated
        if done.any():  # gymnasium's SAME_STEP layout: the terminal step's obs and info in final_*
            info["final_obs"], info["_final_obs"] = obs.copy(), done
            info["final_info"], info["_final_info"] = {"cell": cells.copy(), "_cell": done}, done
            self.positions[done], self.steps[done] = self.layout.start, 0
            obs[done] = self.layout.observe(self.positions[done], self.kind)
            info["cell"] = self._cells()
            np.add.at(self.visits, info["cell"][done], 1)
        return obs, rewards, terminated, truncated, info


class CellInfo(gym.Wrapper):
    """Adds ``info["cell"]``: the agent's grid position as one integer (MiniGrid envs)."""

    def _cell(self) -> int:
        x, y = self.env.unwrapped.agent_pos
        return int(x) * 1000 + int(y)

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return obs, {**info, "cell": self._cell()}

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {**info, "cell": self._cell()}


class DownsampleFrame(gym.ObservationWrapper):
    """A grayscale frame resized to ``size`` × ``size`` by area averaging: the 84 × 84 input of
    CleanRL's Atari preprocessing, without its OpenCV dependency."""

    def __init__(self, env: gym.Env, size: int = 84) -> None:
        super().__init__(env)
        self.size = size
        self.observation_space = gym.spaces.Box(0, 255, (size, size), np.uint8)

    def observation(self, obs: np.ndarray) -> np.ndarray:
        import torch
        import torch.nn.functional as F

        frame = torch.from_numpy(np.asarray(obs, np.float32))[None, None]
        small = F.interpolate(frame, (self.size, self.size), mode="area")[0, 0]
        return small.round().clamp(0, 255).to(torch.uint8).numpy()


class RoomInfo(gym.Wrapper):
    """Adds ``info["cell"]``: the room Montezuma's Revenge shows, RAM byte 3 (1 at the start)."""

    def _room(self) -> int:
        return int(self.env.unwrapped.ale.getRAM()[3])

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return obs, {**info, "cell": self._room()}

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {**info, "cell": self._room()}


def make_vector_env(env_id: str, num_envs: int = 8, **kwargs: Any) -> gym.vector.VectorEnv:
    """A ``SAME_STEP``-autoresetting vector env: :class:`CoordMazeVector` for ``CoordMaze``
    (``kwargs`` are its options), MiniGrid ids as image observations flattened to vectors with
    ``info["cell"]``, Atari ids (``ALE/...``, ROMs from ale-py) as 4 stacked 84 × 84 grayscale
    frames with v5's frame skip 4 and sticky actions 0.25 (Montezuma's Revenge also reports its
    room as ``info["cell"]``), and any other registered gymnasium id through ``gym.make_vec``."""
    if env_id in ("CoordMaze", ENV_ID):
        return CoordMazeVector(num_envs, **kwargs)
    wrappers: list = []
    if env_id.startswith("ALE/"):
        import ale_py

        gym.register_envs(ale_py)
        kwargs = {"obs_type": "grayscale", **kwargs}
        rooms = [RoomInfo] if "MontezumaRevenge" in env_id else []
        stack = functools.partial(gym.wrappers.FrameStackObservation, stack_size=4)
        wrappers = [*rooms, DownsampleFrame, stack]
    if env_id.startswith("MiniGrid"):
        import minigrid  # noqa: F401 (registers the MiniGrid ids)
        from minigrid.wrappers import ImgObsWrapper

        wrappers = [CellInfo, ImgObsWrapper, gym.wrappers.FlattenObservation]
    try:
        gym.spec(env_id)
    except gym.error.Error as error:
        raise ValueError(
            f"env must be 'CoordMaze' or a registered gymnasium id, got {env_id!r} ({error})"
        ) from None
    return gym.make_vec(
        env_id, num_envs, vectorization_mode="sync", wrappers=wrappers,
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}, **kwargs,
    )  # fmt: skip


gym.register(ENV_ID, entry_point=CoordMaze, vector_entry_point=CoordMazeVector)
