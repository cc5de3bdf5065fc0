"""The course's BERT as shapes: its dimensions (ModelShape) and every tensor shape megatron-core gives it on CPU.

harness.evidence.checkpoints.inspector compares a saved checkpoint's tensors with these; every name here is importable there too.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace

from harness.base.imports import import_megatron_core

NVTE_ATTENTION_ENV = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN")  # megatron-core writes them


@dataclass(frozen=True)
class ModelShape:
    """Model dimensions that fix every tensor shape of the course's BERT (Megatron flag names)."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    seq_length: int
    max_position_embeddings: int
    vocab_size: int  # tokenizer size, including the [BOS]/[EOS] the legacy BERT tokenizer adds
    make_vocab_size_divisible_by: int = 128
    binary_head: bool = True
    tensor_model_parallel_size: int = 1

    @property
    def padded_vocab_size(self) -> int:
        """Vocab rows as Megatron allocates them: rounded up to divisible_by x TP."""
        multiple = self.make_vocab_size_divisible_by * self.tensor_model_parallel_size
        return math.ceil(self.vocab_size / multiple) * multiple

    def flags(self) -> str:
        """The Megatron flags that produce these shapes, for remedy lines."""
        return (f"--num-layers {self.num_layers} --hidden-size {self.hidden_size} "
                f"--num-attention-heads {self.num_attention_heads} --ffn-hidden-size {self.ffn_hidden_size} "
                f"--max-position-embeddings {self.max_position_embeddings}, vocab {self.vocab_size} "
                f"padded to {self.padded_vocab_size}")


COURSE_MODEL = ModelShape(num_layers=4, hidden_size=128, num_attention_heads=8, ffn_hidden_size=512,
                          seq_length=128, max_position_embeddings=512, vocab_size=30524,
                          make_vocab_size_divisible_by=128, binary_head=True)


# the dimensions a recipe variant or a checkpoint's saved arguments may set (the FAQ's --hidden-size 64, ffn 256)
SIZE_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "max_position_embeddings")


def course_model(binary_head: bool = True, **sizes) -> ModelShape:
    """The course's model, with or without the binary (SOP) head (recipe (a) or (b)), with any of SIZE_FIELDS
    changed (a variant: hidden_size=64, ffn_hidden_size=256). A size left None keeps the course's."""
    unknown = set(sizes) - set(SIZE_FIELDS)
    if unknown:
        raise TypeError(f"course_model: unknown dimension(s) {sorted(unknown)}")
    changes = {k: int(v) for k, v in sizes.items() if v is not None}
    if "hidden_size" in changes and "ffn_hidden_size" not in changes:
        changes["ffn_hidden_size"] = 4 * changes["hidden_size"]     # Megatron's default ffn size
    if not changes:
        return COURSE_MODEL if binary_head else replace(COURSE_MODEL, binary_head=False)
    return replace(COURSE_MODEL, binary_head=binary_head, **changes)


def model_for_flags(flags: dict) -> ModelShape:
    """The model a recipe variant's flags describe (bert_binary_head, hidden_size, ffn_hidden_size ...)."""
    return course_model(bool(flags.get("bert_binary_head", True)), **{k: flags.get(k) for k in SIZE_FIELDS})


def model_from_args(args, default: ModelShape = COURSE_MODEL) -> ModelShape:
    """The model a checkpoint's saved training arguments describe (common.pt's `args`); `default` for any
    dimension they do not hold as a positive int."""
    changes = {}
    for name in SIZE_FIELDS:
        value = getattr(args, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 20:
            changes[name] = value
    head = getattr(args, "bert_binary_head", None)
    if isinstance(head, bool):
        changes["binary_head"] = head
    return replace(default, **changes) if changes else default


# ---------------------------------------------------------------- expected shapes (megatron-core on CPU)

@contextlib.contextmanager
def single_process_model_parallel() -> Iterator[None]:
    """Give megatron-core a TP=1/PP=1 world; reuse an existing one, tear down only what was created here."""
    import torch.distributed as dist

    import_megatron_core()
    from megatron.core import parallel_state

    created_group = not dist.is_initialized()
    if created_group:  # in-memory store: no port, no file, nothing left behind
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    created_mp = not parallel_state.model_parallel_is_initialized()
    try:
        if created_mp:
            parallel_state.initialize_model_parallel(1, 1)
        yield
    finally:
        if created_mp:
            parallel_state.destroy_model_parallel()
        if created_group:
            dist.destroy_process_group()


def build_bert_model(shape: ModelShape = COURSE_MODEL, init_weights: bool = False):
    """megatron-core BertModel as pretrain_bert.py builds it (local spec, tied output layer), on CPU."""
    import_megatron_core()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed" on CPU
        from megatron.core.models.bert.bert_layer_specs import bert_layer_local_spec
        from megatron.core.models.bert.bert_model import BertModel
        from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(num_layers=shape.num_layers, hidden_size=shape.hidden_size,
                               num_attention_heads=shape.num_attention_heads,
                               ffn_hidden_size=shape.ffn_hidden_size, use_cpu_initialization=True,
                               perform_initialization=init_weights,
                               cuda_graph_scope=[])  # the default "full" is deprecated; [] means the same
    saved = {name: os.environ.get(name) for name in NVTE_ATTENTION_ENV}
    try:
        return BertModel(config=config, transformer_layer_spec=bert_layer_local_spec,
                         vocab_size=shape.padded_vocab_size, max_sequence_length=shape.max_position_embeddings,
                         num_tokentypes=2 if shape.binary_head else 0, add_binary_head=shape.binary_head,
                         share_embeddings_and_output_weights=True, parallel_output=True)
    finally:  # BertModel sets them to "1" (attention backend auto); a trainer launched from here would inherit them
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@functools.lru_cache(maxsize=8)
def _expected_tables(shape: ModelShape) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """(state_dict names -> shape, sharded keys -> global shape), built once per ModelShape."""
    import torch

    import_megatron_core()
    from megatron.core.dist_checkpointing import ShardedTensor
    from megatron.core.dist_checkpointing.dict_utils import nested_values

    with single_process_model_parallel():
        model = build_bert_model(shape)
        plain = {name: tuple(value.shape) for name, value in model.state_dict().items()
                 if isinstance(value, torch.Tensor) and not _is_extra_state(name)}
        sharded = {item.key: tuple(item.global_shape) for item in nested_values(model.sharded_state_dict())
                   if isinstance(item, ShardedTensor) and not _is_extra_state(item.key)}
    return plain, sharded


def expected_model_shapes(shape: ModelShape = COURSE_MODEL) -> dict[str, tuple[int, ...]]:
    """Per-layer state_dict names and shapes (what the ``torch`` format stores), no extra state."""
    return dict(_expected_tables(shape)[0])


def expected_sharded_shapes(shape: ModelShape = COURSE_MODEL) -> dict[str, tuple[int, ...]]:
    """ShardedTensor keys and global shapes (what ``torch_dist`` stores), no extra state."""
    return dict(_expected_tables(shape)[1])


def _is_extra_state(name: str) -> bool:
    """Transformer Engine / local-spec bookkeeping entries carry no weights."""
    return "_extra_state" in name


# Local-spec names for the layer norms that Transformer Engine fuses into the next linear layer.
_TE_TO_LOCAL = (
    (".self_attention.linear_qkv.layer_norm_weight", ".input_layernorm.weight"),
    (".self_attention.linear_qkv.layer_norm_bias", ".input_layernorm.bias"),
    (".mlp.linear_fc1.layer_norm_weight", ".pre_mlp_layernorm.weight"),
    (".mlp.linear_fc1.layer_norm_bias", ".pre_mlp_layernorm.bias"),
)


def _local_name(name: str) -> str:
    """Drop DDP/Float16Module ``module.`` prefixes and map TE's fused layer-norm names to local-spec names."""
    while name.startswith("module."):
        name = name[len("module."):]
    for te_name, local in _TE_TO_LOCAL:
        if name.endswith(te_name):
            return name[: -len(te_name)] + local
    return name
