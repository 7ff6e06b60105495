"""What the experiment caches (the pre-trained shapes UNet, the evaluation networks), loaded back
so that a damaged entry is one line naming the file."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from mixlab.shared.checkpoint import load_state
from mixlab.shared.files import CheckpointError, checkpoint_errors


def load_cached(
    path: Path, what: str, modules: dict[str, nn.Module], *, key: str | None = None
) -> None:
    """Load the state :func:`save_state` wrote at ``path`` into ``modules`` (by entry name).

    A damaged, truncated, edited or foreign cache entry raises :class:`CheckpointError` naming the
    file (delete it and the next run makes it again), never a traceback from deep in torch.
    """
    json_file = path.with_suffix(".json")
    hint = f" (delete the folder {path.parent} to make it again)"
    try:
        state = load_state(path)
        with checkpoint_errors(json_file, what):
            if key is not None and state["key"] != key:
                raise CheckpointError(f"{json_file}: a {what} of other settings{hint}")
            for name, module in modules.items():
                try:
                    module.load_state_dict(state[name])
                except RuntimeError as error:  # missing or unexpected keys, other shapes
                    raise CheckpointError(
                        f"{json_file}: damaged or not a {what} ({' '.join(str(error).split())[:200]})"
                    ) from error
    except CheckpointError as error:
        message = str(error)
        raise CheckpointError(message if hint in message else message + hint) from error
