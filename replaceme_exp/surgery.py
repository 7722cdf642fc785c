"""Surgery: fuse each transform into the down-projection before its cut, remove the cut blocks,
re-index what remains, and save a standard checkpoint, or the *recipe* of one (the base model's
configuration and fingerprint, the cuts and each T: a few MB, from which :func:`apply_recipe` on
the reloaded base model rebuilds the same checkpoint)."""

from __future__ import annotations

import copy
import errno
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from replaceme_exp.models.adapters import DecoderAdapter, adapter_for
from replaceme_exp.models.replacement import ReplacementFFN
from replaceme_exp.selection.cuts import fusion_blocks
from replaceme_exp.selection.search import BlockStates
from replaceme_exp.storage import readable_by_others, write_text

Cut = tuple[int, int]
SEPARATE_TRANSFORMS_FILE = "separate_transforms.safetensors"
# Replacement FFNs beside a checkpoint's weights: "after_block.<index>.<fc1|fc2>.<weight|bias>"
REPLACEMENT_NETWORKS_FILE = "replacement_networks.safetensors"
METADATA_FILE = "replaceme.json"  # what the pruning job wrote beside the weights (save_checkpoint)
RECIPE_SUFFIX = ".recipe.json"  # beside transforms/<config_hash>.safetensors (write_recipe)
MANIFEST_FILE = "replaceme_files.json"  # every file of a saved checkpoint and its size (checkpoint_problem)
WEIGHT_PATTERNS = ("*.safetensors", "*.bin")


@torch.no_grad()
def fuse_transform(adapter: DecoderAdapter, block: int, transform: torch.Tensor) -> None:
    """Make block ``block``'s MLP output ``M T`` instead of ``M``.

    With ``M = x W^T + b`` (``W``: (hidden, intermediate)), ``M T = x (T^T W)^T + T^T b``;
    the product is formed in float64 and cast back to the weight's dtype.
    """
    linear = adapter.fusion_target(block)
    t = transform.to(device=linear.weight.device, dtype=torch.float64)
    linear.weight.copy_((t.T @ linear.weight.double()).to(linear.weight.dtype))
    if linear.bias is not None:
        linear.bias.copy_((t.T @ linear.bias.double()).to(linear.bias.dtype))


@torch.no_grad()
def load_block_states(adapter: DecoderAdapter, states: BlockStates) -> None:
    """Give blocks new parameter values: ``{block index: {parameter name inside the block: value}}``
    (a search's merge, a retrained block), each cast to the parameter's dtype and device. Raises ``ValueError``
    naming a parameter the block lacks or a value of the wrong shape."""
    for index, state in sorted(states.items()):
        parameters = dict(adapter.layers[index].named_parameters())
        for name, value in state.items():
            if name not in parameters:
                raise ValueError(f"block {index} has no parameter {name}")
            target = parameters[name]
            if tuple(value.shape) != tuple(target.shape):
                raise ValueError(f"block {index}'s {name} is {tuple(target.shape)}, the new value {tuple(value.shape)}")
            target.copy_(value.to(device=target.device, dtype=target.dtype))


BLOCK_STATE_PREFIX = "block."  # a new block weight in a transforms file: block.<index>.<parameter name>
NETWORK_PREFIX = "network.after_block."  # a replacement FFN in a transforms file: ...<index>.<parameter>


def block_state_tensors(states: BlockStates) -> dict[str, torch.Tensor]:
    """``states`` as flat named tensors for a safetensors file (``block.<index>.<parameter>``)."""
    return {
        f"{BLOCK_STATE_PREFIX}{index}.{name}": value.detach().cpu().contiguous()
        for index, state in states.items()
        for name, value in state.items()
    }


def block_states_from_tensors(tensors: dict[str, torch.Tensor]) -> BlockStates:
    """The inverse of :func:`block_state_tensors` over a file's tensors (others are ignored)."""
    states: BlockStates = {}
    for key, value in tensors.items():
        if key.startswith(BLOCK_STATE_PREFIX):
            index, name = key[len(BLOCK_STATE_PREFIX) :].split(".", 1)
            states.setdefault(int(index), {})[name] = value
    return states


def kept_blocks(num_layers: int, cuts: list[Cut]) -> list[int]:
    removed = {i for start, end in cuts for i in range(start, end)}
    return [i for i in range(num_layers) if i not in removed]


def prune(
    adapter: DecoderAdapter,
    cuts: list[Cut],
    transforms: dict[Cut, torch.Tensor | None],
    placement: str = "fused",
    block_states: BlockStates | None = None,
    networks: dict[int, ReplacementFFN] | None = None,
) -> list[int]:
    """Apply all cuts in place. ``block_states``: new weights of kept blocks (original indices,
    :func:`load_block_states`), loaded first; ``networks``: an FFN to run after each kept block
    (original index, :func:`attach_replacement_networks`), attached last. Fusion happens in original
    indices before any block is removed, so several cuts need no index bookkeeping. With
    ``placement="separate"`` each T instead multiplies the full output of block ``start-1`` (see
    :func:`attach_separate_transforms`).
    A cut that touches an earlier one (``touching_cuts=compose``) has its T applied after the
    earlier one's, at the same block: ``M T0 T1`` fused, ``L T0 T1`` separate
    (:func:`~replaceme_exp.selection.cuts.fusion_blocks`). Returns the original indices of the
    kept blocks."""
    blocks = fusion_blocks(cuts)
    if block_states:
        load_block_states(adapter, block_states)
    if placement == "fused":
        for cut in sorted(cuts):
            transform = transforms.get(cut)
            if transform is not None:
                fuse_transform(adapter, blocks[cut], transform)
    kept = kept_blocks(adapter.num_layers, cuts)
    adapter.keep_layers(kept)
    if placement == "separate":
        separate: dict[int, torch.Tensor] = {}
        for cut in sorted(cuts):
            if (t := transforms.get(cut)) is not None:
                index = kept.index(blocks[cut])
                separate[index] = separate[index].double() @ t.double() if index in separate else t
        attach_separate_transforms(adapter, separate)
    elif placement != "fused":
        raise ValueError(f"lt_placement={placement!r}: choose fused or separate")
    if networks:
        attach_replacement_networks(adapter, {kept.index(index): net for index, net in networks.items()})
    return kept


def attach_separate_transforms(adapter: DecoderAdapter, transforms: dict[int, torch.Tensor]) -> None:
    """Make block ``i``'s output ``L_i T`` for each ``{i: T}`` (indices of the current model),
    in addition to transforms attached earlier (a block given again gets the new T).

    T lives in a forward hook, not in a new module, so the model's weights and state dict stay
    those of a plain pruned checkpoint; ``save_checkpoint`` writes the transforms beside them
    and :func:`load_pruned` re-attaches them. Blocks before a later cut keep their index when
    that cut is removed, so cuts applied in ascending order keep the recorded indices valid.
    """
    model = adapter.model
    handles = getattr(model, "_replaceme_separate_hooks", {})
    stored = getattr(model, "_replaceme_separate_transforms", {})
    for index, transform in transforms.items():
        if index in handles:
            handles.pop(index).remove()
        first = next(adapter.layers[index].parameters())
        block = adapter.layers[index]
        # a trainable T (healing) keeps its dtype and is cast in each product; a fixed one is cast once
        dtype = transform.dtype if transform.requires_grad else first.dtype
        weight = transform.to(device=first.device, dtype=dtype)

        def hook(module, args, output, weight=weight):
            hidden = output[0] if isinstance(output, tuple) else output
            # a layer-wise capture runs the block on another device than where it lives
            same = weight.device == hidden.device and weight.dtype == hidden.dtype
            transformed = hidden @ (weight if same else weight.to(hidden.device, hidden.dtype))
            return (transformed, *output[1:]) if isinstance(output, tuple) else transformed

        handles[index] = block.register_forward_hook(hook)
        stored[index] = transform.detach().cpu()
    model._replaceme_separate_hooks = handles
    model._replaceme_separate_transforms = stored


def attach_replacement_networks(adapter: DecoderAdapter, networks: dict[int, ReplacementFFN]) -> None:
    """Make block ``i``'s output ``net(L_i)`` for each ``{i: net}`` (indices of the current model):
    a trained FFN in place of the cut after block ``i``.

    Like a separate T, the network lives in a forward hook (cast to the block's dtype and device),
    not as a module of the model, so the state dict stays a plain pruned checkpoint's;
    ``save_checkpoint`` writes the networks beside it and :func:`load_pruned` re-attaches them.
    Their parameters count in :func:`replacement_parameters`, not in the model's."""
    model = adapter.model
    handles = getattr(model, "_replaceme_replacement_hooks", {})
    stored = getattr(model, "_replaceme_replacement_networks", {})
    for index, network in networks.items():
        if index in handles:
            handles.pop(index).remove()
        first = next(adapter.layers[index].parameters())
        network = copy.deepcopy(network).to(device=first.device, dtype=first.dtype).eval().requires_grad_(False)

        def hook(module, args, output, network=network):
            hidden = output[0] if isinstance(output, tuple) else output
            weight = network.fc1.weight
            if weight.device != hidden.device or weight.dtype != hidden.dtype:  # a layer-wise pass
                network.to(device=hidden.device, dtype=hidden.dtype)
            replaced = network(hidden)
            return (replaced, *output[1:]) if isinstance(output, tuple) else replaced

        handles[index] = adapter.layers[index].register_forward_hook(hook)
        stored[index] = network
    model._replaceme_replacement_hooks = handles
    model._replaceme_replacement_networks = stored


def replacement_parameters(model) -> int:
    """Parameters ``model`` carries beside its own (not in its own count): its replacement
    networks, and each separate transform's d x d."""
    networks = getattr(model, "_replaceme_replacement_networks", {})
    separate = getattr(model, "_replaceme_separate_transforms", None) or {}
    return sum(p.numel() for network in networks.values() for p in network.parameters()) + sum(
        t.numel() for t in separate.values()
    )


def network_tensors(networks: dict[int, ReplacementFFN], prefix: str = "after_block.") -> dict[str, torch.Tensor]:
    """``{index: net}`` as flat named tensors for a safetensors file (``<prefix><index>.fc1.weight``, ...)."""
    return {
        f"{prefix}{index}.{name}": value.detach().cpu().contiguous()
        for index, network in networks.items()
        for name, value in network.state_dict().items()
    }


def networks_from_tensors(tensors: dict[str, torch.Tensor], prefix: str = "after_block.") -> dict[int, ReplacementFFN]:
    """The inverse of :func:`network_tensors` over a file's tensors (others are ignored)."""
    states: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith(prefix):
            index, name = key[len(prefix) :].split(".", 1)
            states.setdefault(int(index), {})[name] = value
    return {index: ReplacementFFN.from_state(state) for index, state in states.items()}


def load_pruned(path: str | os.PathLike, **kwargs):
    """Load a pruned checkpoint; for the separate placement, re-attach its transforms; for
    a replacement FFN, its networks."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    attach_saved_transforms(model, path)
    return model


def attach_saved_transforms(model, path: str | os.PathLike) -> bool:
    """Re-attach the separate transforms (``lt_placement=separate``) and replacement networks
    (a trained FFN) a checkpoint at ``path`` carries beside its weights to ``model``,
    loaded from it; returns whether it had any."""
    from safetensors.torch import load_file

    file, networks = Path(path) / SEPARATE_TRANSFORMS_FILE, Path(path) / REPLACEMENT_NETWORKS_FILE
    if networks.is_file():
        attach_replacement_networks(adapter_for(model), networks_from_tensors(load_file(networks)))
    if not file.is_file():
        return networks.is_file()
    tensors = load_file(file)
    attach_separate_transforms(adapter_for(model), {int(k.split(".")[1]): v for k, v in tensors.items()})
    return True


def checkpoint_metadata(path: str | os.PathLike) -> dict | None:
    """What the pruning job wrote beside a checkpoint it saved (``run_id``, ``config_hash``, ``model``,
    ``cuts``, ``objective``, ``alpha``, ``kept_blocks``); None for a checkpoint this project did not
    save (or whose metadata is unreadable)."""
    file = Path(path) / METADATA_FILE
    try:
        metadata = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    return metadata if isinstance(metadata, dict) else None


def save_checkpoint(model, tokenizer, path: str | os.PathLike, metadata: dict, processor=None) -> Path:
    """Save model and tokenizer as safetensors under ``path`` (atomically), with the pruning
    metadata in ``replaceme.json`` and the list of its files and sizes in ``replaceme_files.json``
    (:func:`checkpoint_problem`). Loadable by ``AutoModelForCausalLM.from_pretrained``; a model
    with separate transforms also gets ``separate_transforms.safetensors`` and needs
    :func:`load_pruned` to apply them (it is not a plain checkpoint); so does one with
    a replacement FFN (``replacement_networks.safetensors``)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    recover_checkpoint(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".save-{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if processor is not None:  # a vision model's image processor
            processor.save_pretrained(tmp)
        if extra := beside_weights(model):
            from safetensors.torch import save_file

            for name, tensors in extra.items():
                save_file(tensors, tmp / name)
        (tmp / METADATA_FILE).write_text(json.dumps(metadata, indent=2, default=str))
        write_manifest(tmp)
        readable_by_others(tmp)
        replace_directory(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def beside_weights(model) -> dict[str, dict[str, torch.Tensor]]:
    """What a pruned model carries beyond its own state dict, as :func:`save_checkpoint` writes it
    beside the weights: ``{file name: {tensor name: tensor}}``, the separate transforms
    (``after_block.<i>``: (d, d) T in its stored dtype) and the replacement FFNs
    (``after_block.<i>.<fc1|fc2>.<weight|bias>``); empty for a plain pruned (or unpruned) model."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    if separate := getattr(model, "_replaceme_separate_transforms", None):
        out[SEPARATE_TRANSFORMS_FILE] = {f"after_block.{i}": t.contiguous() for i, t in separate.items()}
    if networks := getattr(model, "_replaceme_replacement_networks", None):
        out[REPLACEMENT_NETWORKS_FILE] = network_tensors(networks)
    return out


def write_manifest(directory: Path) -> None:
    """List every file under ``directory`` with its size in bytes in ``MANIFEST_FILE`` (what
    :func:`checkpoint_problem` checks)."""
    files = {
        p.relative_to(directory).as_posix(): p.stat().st_size
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != MANIFEST_FILE
    }
    (directory / MANIFEST_FILE).write_text(json.dumps({"files": files}, indent=2))


def checkpoint_problem(path: str | os.PathLike) -> str | None:
    """What makes the checkpoint at ``path`` incomplete, naming the file (``... is missing``, ``...
    has 10 of 4096 bytes``); None when it is whole. A checkpoint :func:`save_checkpoint` wrote is
    checked against its ``MANIFEST_FILE``: every file listed, at its size. Sizes, not hashes:
    hashing tens of GB at every skip would take minutes, so a file rewritten in place at the same
    size passes. A checkpoint saved before the manifest existed needs ``config.json`` and at least
    one weight file (``*.safetensors`` / ``*.bin``)."""
    directory = Path(path)
    if not directory.is_dir():
        return f"{directory} is missing"
    manifest = directory / MANIFEST_FILE
    if not manifest.exists():
        if not (directory / "config.json").is_file():
            return f"{directory / 'config.json'} is missing"
        if not any(any(directory.glob(pattern)) for pattern in WEIGHT_PATTERNS):
            return f"{directory} has no weight file ({' or '.join(WEIGHT_PATTERNS)})"
        return None
    try:
        files = json.loads(manifest.read_text())["files"]
        listed = {str(name): int(size) for name, size in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return f"its file list {manifest} is unreadable ({err})"
    for name, size in listed.items():
        file = directory / name
        if not file.is_file():
            return f"{file} is missing"
        if (actual := file.stat().st_size) != size:
            return f"{file} has {actual} of {size} bytes"
    return None


def replace_directory(new: Path, target: Path) -> None:
    """Put ``new`` at ``target`` without ever deleting a finished ``target`` before ``new`` is in
    place: the old one is renamed aside (``.old-<name>-*``), ``new`` renamed in, and only then the
    old one removed. A kill between the renames leaves the old one aside, and
    :func:`recover_checkpoint` puts it back. If another job put the same checkpoint in place first
    (``target`` appeared meanwhile), that one is kept."""
    aside = None
    if target.exists():
        aside = Path(tempfile.mkdtemp(prefix=f".old-{target.name}-", dir=target.parent))
        try:
            os.rename(target, aside / "model")
        except FileNotFoundError:  # another save moved it aside first
            pass
    try:
        os.rename(new, target)
    except OSError as err:
        # ENOTEMPTY/EEXIST: another save's checkpoint was at ``target`` at that instant. It may be
        # moved aside again by a third save right after, which then puts its own in place.
        identical_first = err.errno in (errno.ENOTEMPTY, errno.EEXIST)
        if not target.exists() and aside is not None and (aside / "model").exists():
            try:
                os.rename(aside / "model", target)  # put the finished model back
            except OSError:  # yet another save got there first: its checkpoint stays
                pass
        if not identical_first:  # a real failure (EACCES, EIO, ...): the new model is not in place
            raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def recover_checkpoint(target: str | os.PathLike) -> bool:
    """If ``target`` is missing but a killed save left the finished checkpoint aside, put it
    back; remove leftovers of killed saves (``.save-<name>-*``; the caller holds the config's lock,
    so no save of it is in progress). Returns whether one was restored."""
    target = Path(target)
    restored = False
    if target.parent.is_dir():
        for aside in sorted(target.parent.glob(f".old-{target.name}-*"), key=lambda p: p.stat().st_mtime):
            if not target.exists() and (aside / "model" / "config.json").is_file():
                os.rename(aside / "model", target)
                restored = True
            shutil.rmtree(aside, ignore_errors=True)
        for partial in target.parent.glob(f".save-{target.name}-*"):  # callers hold the config's lock
            shutil.rmtree(partial, ignore_errors=True)
    return restored


def recipe_path(transforms_file: str | os.PathLike) -> Path:
    """The recipe beside a transforms file: ``transforms/<config_hash>.recipe.json``."""
    transforms_file = Path(transforms_file)
    return transforms_file.with_name(transforms_file.name.removesuffix(".safetensors") + RECIPE_SUFFIX)


def write_recipe(transforms_file: str | os.PathLike, recipe: dict) -> Path:
    """Write the recipe of a pruned model beside its transforms file (written before): ``recipe``
    (the job's ``config``, ``config_hash``, ``model_fingerprint``, ``cuts``, ``sequential``,
    ``lt_placement``, ``dtypes`` of each T as fitted, the checkpoint's ``metadata``) plus the
    transforms file's name and size, which :func:`recipe_problem` checks."""
    transforms_file = Path(transforms_file)
    target = recipe_path(transforms_file)
    whole = {**recipe, "transforms_file": transforms_file.name, "transforms_bytes": transforms_file.stat().st_size}
    write_text(target, json.dumps(whole, indent=2, default=str))
    return target


def read_recipe(transforms_file: str | os.PathLike) -> dict:
    """The recipe beside ``transforms_file``; raises ``FileNotFoundError`` / ``ValueError`` naming
    what is wrong (:func:`recipe_problem`)."""
    if problem := recipe_problem(transforms_file):
        error = FileNotFoundError if "missing" in problem else ValueError
        raise error(problem)
    return json.loads(recipe_path(transforms_file).read_text())


def recipe_problem(transforms_file: str | os.PathLike) -> str | None:
    """What makes a saved recipe incomplete (``... is missing``, ``... has 10 of 4096 bytes``, an
    unreadable recipe), or None when the recipe and its transforms file are whole."""
    transforms_file, recipe = Path(transforms_file), recipe_path(transforms_file)
    if not recipe.is_file():
        return f"{recipe} is missing"
    try:
        size = int(json.loads(recipe.read_text())["transforms_bytes"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"its recipe {recipe} is unreadable ({err})"
    if not transforms_file.is_file():
        return f"{transforms_file} is missing"
    if (actual := transforms_file.stat().st_size) != size:
        return f"{transforms_file} has {actual} of {size} bytes"
    return None


def apply_recipe(
    adapter: DecoderAdapter,
    cuts: list[Cut],
    transforms: dict[Cut, torch.Tensor | None],
    placement: str,
    sequential: bool,
    block_states: BlockStates | None = None,
    networks: dict[int, ReplacementFFN] | None = None,
) -> list[int]:
    """Prune the unpruned model behind ``adapter`` as the job did (``block_states``: new weights of
    kept blocks, a search's merges or a retrained block; ``networks``: FFNs after kept blocks, by
    original index): all cuts at once, or
    (``sequential``, ``multi_lt=sequential``) one at a time in ascending order, each at its place in
    the model the earlier ones left. ``transforms``: keyed by the unpruned model's cuts. Returns the
    original indices of the kept blocks."""
    if not sequential:
        return prune(adapter, cuts, transforms, placement, block_states, networks)
    if block_states or networks:
        raise ValueError("a sequential recipe with new block weights or networks: no job writes one")
    removed, num_layers = 0, adapter.num_layers
    for cut in cuts:
        shifted = (cut[0] - removed, cut[1] - removed)
        prune(adapter, [shifted], {shifted: transforms.get(cut)}, placement)
        removed += cut[1] - cut[0]
    return kept_blocks(num_layers, cuts)
