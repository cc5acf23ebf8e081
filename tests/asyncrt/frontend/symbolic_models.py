"""ONNX models with symbolic dimensions, built with ``onnx.helper`` as
PyTorch's exporter writes them (``dynamic_axes``): a BERT-style sentence
encoder and a CNN with a symbolic batch.

The encoder follows ``torch.onnx.export`` of a Hugging Face ``BertModel``
node for node: the extended attention mask (``Unsqueeze -> Cast -> Sub ->
Mul``), position ids sliced from a buffer by ``Shape -> Gather``, every
head split and merge reshaped by a ``Shape -> Gather -> Unsqueeze ->
Concat`` chain, GELU as ``Erf`` arithmetic, ``LayerNormalization``
(opset 17), and the pooler (first token, dense, tanh).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .models import model_of

__all__ = ("BertConfig", "bert_encoder", "bert_feed", "cnn_symbolic_batch")


@dataclass(frozen=True)
class BertConfig:
    """The encoder's size (default: MiniLM-L6, about 86 MB of weights)."""

    layers: int = 6
    hidden: int = 384
    heads: int = 12
    intermediate: int = 1536
    vocab: int = 30522
    max_positions: int = 512
    type_vocab: int = 2


#: A small encoder for the tests: the same graph, tiny weights.
TINY = BertConfig(layers=2, hidden=32, heads=4, intermediate=64, vocab=100)


class _Nodes:
    """Collects nodes and initializers with unique, exporter-like names."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def op(
        self, op_type: str, inputs: list[str], n_out: int = 1, **attrs: object
    ) -> str:
        self.count += 1
        name = f"/{op_type}_{self.count}"
        outs = [f"{name}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, **attrs))
        return outs[0]

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def weight(self, name: str, *shape: int, scale: float = 0.05) -> str:
        array = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        return self.const(name, array)

    def scalar_i64(self, value: int) -> str:
        out = self.op("Constant", [], value=numpy_helper.from_array(np.array(value)))
        return out

    def ints(self, values: list[int]) -> str:
        array = np.array(values, dtype=np.int64)
        return self.op("Constant", [], value=numpy_helper.from_array(array))

    def dim(self, tensor: str, axis: int) -> str:
        """``Shape -> Gather(axis) -> Unsqueeze``: one dimension as a 1-D
        tensor, as the exporter computes ``x.size(axis)``."""
        shape = self.op("Shape", [tensor])
        scalar = self.op("Gather", [shape, self.scalar_i64(axis)], axis=0)
        return self.op("Unsqueeze", [scalar, self.ints([0])])

    def linear(self, x: str, prefix: str, n_in: int, n_out: int) -> str:
        w = self.weight(f"{prefix}.weight_t", n_in, n_out)
        b = self.weight(f"{prefix}.bias", n_out, scale=0.02)
        return self.op("Add", [self.op("MatMul", [x, w]), b])

    def layer_norm(self, x: str, prefix: str, width: int) -> str:
        gamma = self.const(
            f"{prefix}.weight",
            (1 + self.rng.standard_normal(width) * 0.05).astype(np.float32),
        )
        beta = self.weight(f"{prefix}.bias", width, scale=0.02)
        return self.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=1e-12)


def bert_encoder(config: BertConfig = TINY, *, pooler: bool = True) -> onnx.ModelProto:
    """A BERT encoder with inputs ``input_ids``, ``attention_mask`` and
    ``token_type_ids`` (int64, ``("batch", "sequence")``) and outputs
    ``last_hidden_state`` (and ``pooler_output``)."""
    c = config
    head_dim = c.hidden // c.heads
    g = _Nodes(np.random.default_rng(7))
    # extended attention mask: (1 - mask[:, None, None, :]) * finfo.min
    mask = g.op("Unsqueeze", ["attention_mask", g.ints([1])])
    mask = g.op("Unsqueeze", [mask, g.ints([2])])
    mask = g.op("Cast", [mask], to=TensorProto.FLOAT)
    one = g.const("one", np.array(1.0, np.float32))
    mask = g.op("Sub", [one, mask])
    low = g.const("finfo_min", np.array(np.finfo(np.float32).min, np.float32))
    mask = g.op("Mul", [mask, low])
    # embeddings: position ids sliced from a buffer by the sequence length
    seq = g.op("Gather", [g.op("Shape", ["input_ids"]), g.scalar_i64(1)], axis=0)
    positions = g.const(
        "embeddings.position_ids", np.arange(c.max_positions, dtype=np.int64)[None]
    )
    ends = g.op("Unsqueeze", [seq, g.ints([0])])
    position_ids = g.op(
        "Slice", [positions, g.ints([0]), ends, g.ints([1]), g.ints([1])]
    )
    words = g.op(
        "Gather", [g.weight("word_embeddings", c.vocab, c.hidden), "input_ids"]
    )
    types = g.op(
        "Gather",
        [g.weight("token_type_embeddings", c.type_vocab, c.hidden), "token_type_ids"],
    )
    h = g.op("Add", [words, types])
    pos = g.op(
        "Gather",
        [g.weight("position_embeddings", c.max_positions, c.hidden), position_ids],
    )
    h = g.layer_norm(g.op("Add", [h, pos]), "embeddings.LayerNorm", c.hidden)
    scale = g.const("sqrt_head_dim", np.array(math.sqrt(head_dim), np.float32))
    sqrt2 = g.const("sqrt2", np.array(math.sqrt(2.0), np.float32))
    half = g.const("half", np.array(0.5, np.float32))
    for layer in range(c.layers):
        p = f"encoder.layer.{layer}"

        def heads(x: str, layer_prefix: str = p) -> str:
            shape = g.op(
                "Concat",
                [g.dim(x, 0), g.dim(x, 1), g.ints([c.heads]), g.ints([head_dim])],
                axis=0,
            )
            return g.op("Transpose", [g.op("Reshape", [x, shape])], perm=[0, 2, 1, 3])

        q = heads(g.linear(h, f"{p}.attention.self.query", c.hidden, c.hidden))
        k = heads(g.linear(h, f"{p}.attention.self.key", c.hidden, c.hidden))
        v = heads(g.linear(h, f"{p}.attention.self.value", c.hidden, c.hidden))
        kt = g.op("Transpose", [k], perm=[0, 1, 3, 2])
        scores = g.op("Div", [g.op("MatMul", [q, kt]), scale])
        probs = g.op("Softmax", [g.op("Add", [scores, mask])], axis=-1)
        ctx = g.op("Transpose", [g.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        merged_shape = g.op(
            "Concat", [g.dim(ctx, 0), g.dim(ctx, 1), g.ints([c.hidden])], axis=0
        )
        ctx = g.op("Reshape", [ctx, merged_shape])
        attn = g.linear(ctx, f"{p}.attention.output.dense", c.hidden, c.hidden)
        h = g.layer_norm(
            g.op("Add", [attn, h]), f"{p}.attention.output.LayerNorm", c.hidden
        )
        inter = g.linear(h, f"{p}.intermediate.dense", c.hidden, c.intermediate)
        erf = g.op("Erf", [g.op("Div", [inter, sqrt2])])
        gelu = g.op("Mul", [g.op("Mul", [inter, g.op("Add", [erf, one])]), half])
        out = g.linear(gelu, f"{p}.output.dense", c.intermediate, c.hidden)
        h = g.layer_norm(g.op("Add", [out, h]), f"{p}.output.LayerNorm", c.hidden)
    g.nodes.append(helper.make_node("Identity", [h], ["last_hidden_state"]))
    outputs = [
        helper.make_tensor_value_info(
            "last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", c.hidden]
        )
    ]
    if pooler:
        first = g.op("Gather", [h, g.scalar_i64(0)], axis=1)
        pooled = g.linear(first, "pooler.dense", c.hidden, c.hidden)
        g.nodes.append(helper.make_node("Tanh", [pooled], ["pooler_output"]))
        outputs.append(
            helper.make_tensor_value_info(
                "pooler_output", TensorProto.FLOAT, ["batch", c.hidden]
            )
        )
    inputs = [
        helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])
        for name in ("input_ids", "attention_mask", "token_type_ids")
    ]
    graph = helper.make_graph(g.nodes, "bert", inputs, outputs, g.inits)
    model = model_of(graph, 17)
    onnx.checker.check_model(model)
    return model


def bert_feed(
    batch: int, seq: int, config: BertConfig = TINY, seed: int = 0
) -> dict[str, np.ndarray]:
    """Inputs for :func:`bert_encoder`: random tokens, a padded mask."""
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.int64)
    for row in range(batch):
        mask[row, seq - min(row, seq - 1) :] = 0  # later rows padded more
    return {
        "input_ids": rng.integers(0, config.vocab, (batch, seq), dtype=np.int64),
        "attention_mask": mask,
        "token_type_ids": rng.integers(0, config.type_vocab, (batch, seq)).astype(
            np.int64
        ),
    }


def cnn_symbolic_batch(opset: int = 17) -> onnx.ModelProto:
    """The frontend tests' small CNN (conv-bn-relu, a depthwise residual
    block, pools, a shape-computed flatten, a Gemm classifier) with input
    ``x ("N", 3, 16, 16)`` and output ``probs ("N", 10)``."""
    from .models import small_cnn

    model = small_cnn(opset=opset)
    for value in (model.graph.input[0], model.graph.output[0]):
        dim = value.type.tensor_type.shape.dim[0]
        dim.Clear()
        dim.dim_param = "N"
    onnx.checker.check_model(model)
    return model
