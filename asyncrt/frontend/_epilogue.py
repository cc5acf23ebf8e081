"""Import-time fusions of a transformer's GEMM epilogues and residual norms,
as ONNX Runtime's own (``MatMulAddFusion``, ``BiasGeluFusion``,
``SkipLayerNormFusion``). Each makes one node of asyncrt's private domain
(rules in :mod:`._rules_epilogue`, kernels in :mod:`asyncrt.ops.epilogue`):

* ``MatMul(X, W) -> Add(B)``, ``W`` a 2-D constant and ``B`` a constant of
  shape ``(W.shape[1],)``, becomes ``MatMulBias(X, W, B)``; where only a
  ``Split`` of the last axis reads the sum (attention's Q, K and V from
  one product: GPT-2's, or the import's merged projections), the node
  gives the parts as its outputs (attributes ``axis`` and ``splits``), and
  the kernel writes each part itself instead of a copy after; where the sum
  only feeds the exact erf GELU as PyTorch exports it (``Div(y, sqrt 2) ->
  Erf -> Add(1) -> Mul(y) -> Mul(0.5)``), that joins it as
  ``activation="gelu"``; where it feeds GPT-2's tanh GELU as PyTorch
  exports ``GELU(approximate="tanh")`` (``Pow(y, 3) -> Mul(0.044715) ->
  Add(y) -> Mul(sqrt(2/pi)) -> Tanh -> Add(1)``, times ``Mul(y, 0.5)``;
  the cube may also be ``(y * y) * y``, as hand-written GELUs have it),
  as ``activation="gelu_tanh"``; ONNX's own ``Gelu`` node (opset 20)
  joins it the same way (``approximate`` ``"none"`` or ``"tanh"``), and a
  ``Relu`` as ``activation="relu"`` (an MLP's hidden layers).
* ``Add(X, R) -> LayerNormalization(Scale[, Bias])``, one output and the
  default stash type, becomes ``AddLayerNormalization(X, R, Scale[,
  Bias])``; where others read the sum too (a pre-LN block's next residual),
  the fused node gives it as a second output (where the scale and bias are
  made before the Add).
* attention's ``Div(X, C)`` (or ``Mul``), ``C`` a constant scalar, ``->
  Add(M) -> Softmax`` over the last axis (opset 13 on) becomes
  ``ScaleAddSoftmax(X, C, M)`` (``ScaleAddSoftmax(X, C)`` without a
  mask); a causal mask as PyTorch exports it,
  ``-> Where(K, scaled, F) -> Softmax`` (or ``Where(K, F, scaled)``), ``F``
  a constant scalar, becomes ``ScaleWhereSoftmax(X, C, K, F)``, attribute
  ``keep`` (1: the scores stay where ``K`` holds, 0: where it does not).
* ``Transpose -> Transpose`` becomes one Transpose (the permutations
  composed); then a MatMul that reads Transposes (explicit permutations)
  or is read by one becomes ``TransposedMatMul(A, B)`` with attributes
  ``perm_a``, ``perm_b`` and ``perm_out`` (those present): attention's head
  splits and merges as views instead of copies.

* a CNN's squeeze-excitation (MobileNetV3's, as torchvision exports it):
  ``GlobalAveragePool(X) -> Conv(W1, B1) -> Relu -> Conv(W2, B2) ->
  HardSigmoid`` (or ``Sigmoid``) ``-> Mul(X)``, both convolutions 1 x 1
  without pads, strides, dilations or groups, becomes
  ``SqueezeExcite(X, W1, B1, W2, B2)`` with attributes ``gate``
  (``"hard_sigmoid"`` or ``"sigmoid"``), ``alpha`` and ``beta``: six
  launches of microseconds each where the gate is computed on 1 x 1
  planes. Where a 1 x 1 convolution as above (constant float32 weights)
  alone reads its output, the pair becomes ``SqueezeGates(X, W1, B1, W2,
  B2)`` (the gates, ``(N, C)``) and ``GatedPointwise(X, G, W, B)`` with
  the convolution's ``activation``: the convolution scales its input's
  rows as it loads them, and the scaled tensor is never written.
* an inverted residual block's expansion and depthwise step: a 1 x 1
  ``Conv(X, W1, B1)`` as above (its activation folded in before, or none)
  read only by a depthwise ``Conv(W2, B2)`` (2-D, one group a channel,
  explicit pads, float32 constants) becomes ``PointwiseDepthwise(X, W1,
  B1, W2, B2)`` with the depthwise step's ``kernel_shape``, ``strides``,
  ``pads`` and ``dilations`` and attributes ``pointwise_activation`` and
  ``activation`` (``"none"``, ``"relu"`` or ``"hard_swish"``): the
  expanded tensor, the largest of the block, is never written.

A node is only absorbed where nothing else reads its output (no other
node, no graph output); the fused node takes the last member's output
name, so readers and graph outputs need no change.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx

from ._names import PRIVATE_DOMAIN, is_op, unique_name

__all__ = ("fuse_epilogues",)

Const = Callable[[str], "np.ndarray[Any, Any] | None"]
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def fuse_epilogues(
    graph: onnx.GraphProto,
    const: Const,
    opset: int,
    activations: Mapping[str, str] | None = None,
) -> int:
    """Fuse ``graph``'s epilogues in place (see the module docstring).

    :param const: the value of a constant tensor by name, or ``None``.
    :param opset: the model's opset of the default domain.
    :param activations: the activation each Conv applies, by its output
        (a Relu folded into it before: :mod:`._rewrite`).
    :return: how many nodes were absorbed into others.
    """
    fuser = _Fuser(graph, const, activations or {})
    count = fuser.matmul_bias() + fuser.add_layer_norm()
    if opset >= 13:  # before, Softmax flattens its input from the axis on
        count += fuser.scale_add_softmax()
    count += fuser.compose_transposes()
    count += fuser.transposed_matmuls()
    count += fuser.squeeze_excitations()
    count += fuser.gated_pointwise()
    count += fuser.pointwise_depthwise()
    count += fuser.residual_adds()
    if count:
        fuser.commit()
    return count


class _Fuser:
    def __init__(
        self, graph: onnx.GraphProto, const: Const, activations: Mapping[str, str]
    ) -> None:
        self.graph = graph
        self.const = const
        self.activations = activations
        self.nodes: list[onnx.NodeProto | None] = list(graph.node)
        self.readers = Counter(n for node in graph.node for n in node.input if n)
        self.outputs = {out.name for out in graph.output}
        self.reader_of: dict[str, list[int]] = {}
        self.producer: dict[str, int] = {}
        for index, node in enumerate(graph.node):
            for name in node.input:
                if name:
                    self.reader_of.setdefault(name, []).append(index)
            for name in node.output:
                if name:
                    self.producer[name] = index

    def only_reader(self, tensor: str, op_type: str) -> tuple[int, onnx.NodeProto]:
        """The ``op_type`` node that alone reads ``tensor`` (raises
        ``LookupError`` where there is none)."""
        if self.readers[tensor] != 1 or tensor in self.outputs:
            raise LookupError(tensor)
        index = self.reader_of[tensor][0]
        node = self.nodes[index]
        if node is None or not is_op(node, op_type):
            raise LookupError(tensor)
        return index, node

    def other(self, node: onnx.NodeProto, tensor: str) -> str:
        """The input of binary ``node`` that is not ``tensor``."""
        if len(node.input) != 2 or list(node.input).count(tensor) != 1:
            raise LookupError(tensor)
        return str(node.input[1] if node.input[0] == tensor else node.input[0])

    def scalar(self, name: str, value: float, *, rtol: float = 1e-6) -> bool:
        """Whether ``name`` is a constant scalar equal to ``value``."""
        array = self.const(name)
        return (
            array is not None
            and array.size == 1
            and array.dtype in _FLOATS
            and math.isclose(float(array.reshape(())), value, rel_tol=rtol)
        )

    def matmul_bias(self) -> int:
        count = 0
        for index, node in enumerate(self.nodes):
            if node is None or not is_op(node, "MatMul") or len(node.input) != 2:
                continue
            weight = self.const(node.input[1])
            if weight is None or weight.ndim != 2 or weight.dtype not in _FLOATS:
                continue
            try:
                add_index, add = self.only_reader(node.output[0], "Add")
                bias_name = self.other(add, node.output[0])
            except LookupError:
                continue
            bias = self.const(bias_name)
            if (
                bias is None
                or bias.shape != (weight.shape[1],)
                or bias.dtype != weight.dtype
            ):
                continue
            absorbed = [add_index]
            output, activation = add.output[0], "none"
            for name, match in (
                ("gelu", self.gelu),
                ("gelu_tanh", self.gelu_tanh),
                ("gelu", self.gelu_node),
                ("gelu_tanh", self.gelu_node_tanh),
                ("relu", self.relu),
            ):
                found = match(output)
                if found is not None:
                    absorbed += found[0]
                    output, activation = found[1], name
                    break
            outputs, split_attrs = [output], {}
            if activation == "none":
                found_split = self.split_last(output, weight.shape[1])
                if found_split is not None:
                    absorbed.append(found_split[0])
                    outputs, split_attrs = found_split[1], found_split[2]
            fused = onnx.helper.make_node(
                "MatMulBias",
                [node.input[0], node.input[1], bias_name],
                outputs,
                name=node.name,
                domain=PRIVATE_DOMAIN,
                activation=activation,
                **split_attrs,
            )
            self.nodes[index] = fused
            for position in absorbed:
                self.nodes[position] = None
            count += len(absorbed)
        return count

    def split_last(
        self, y: str, width: int
    ) -> tuple[int, list[str], dict[str, Any]] | None:
        """A ``Split`` of ``y``'s last axis (``width`` wide), its only
        reader: its index, outputs and the ``axis`` and ``splits``
        attributes that make a ``MatMulBias`` write the parts itself. The
        axis is kept as given (the rule checks it against the shapes)."""
        try:
            index, node = self.only_reader(y, "Split")
        except LookupError:
            return None
        given = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        axis = int(given.get("axis", 0))
        outputs = [str(name) for name in node.output]
        if not all(outputs) or len(outputs) < 2:
            return None
        if len(node.input) > 1 and node.input[1]:
            sizes = self.const(node.input[1])
            if sizes is None or sizes.ndim != 1:
                return None
            splits = [int(v) for v in sizes]
        elif "split" in given:
            splits = [int(v) for v in given["split"]]
        elif axis == -1 and width % len(outputs) == 0:
            splits = [width // len(outputs)] * len(outputs)
        else:
            return None
        # an axis counted from the front is the last only if it is as wide
        if len(splits) != len(outputs) or sum(splits) != width or min(splits) < 1:
            return None
        return index, outputs, {"axis": axis, "splits": splits}

    def relu(self, y: str) -> tuple[list[int], str] | None:
        """A ``Relu``, the only reader of ``y``."""
        try:
            index, node = self.only_reader(y, "Relu")
        except LookupError:
            return None
        return [index], str(node.output[0])

    def gelu_node(self, y: str) -> tuple[list[int], str] | None:
        """ONNX's ``Gelu`` (opset 20), exact, the only reader of ``y``."""
        return self._gelu_op(y, "none")

    def gelu_node_tanh(self, y: str) -> tuple[list[int], str] | None:
        """ONNX's ``Gelu`` with ``approximate="tanh"``, the only reader of
        ``y``."""
        return self._gelu_op(y, "tanh")

    def _gelu_op(self, y: str, approximate: str) -> tuple[list[int], str] | None:
        try:
            index, node = self.only_reader(y, "Gelu")
        except LookupError:
            return None
        given = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        form = given.get("approximate", b"none")
        form = form.decode() if isinstance(form, bytes) else str(form)
        if form != approximate or len(node.output) != 1:
            return None
        return [index], str(node.output[0])

    def gelu(self, y: str) -> tuple[list[int], str] | None:
        """The nodes of ``0.5 * (y * (1 + erf(y / sqrt 2)))`` over ``y`` (its
        only readers) and the GELU's output name, or ``None``."""
        if y in self.outputs or self.readers[y] != 2:
            return None
        readers = [(i, self.nodes[i]) for i in self.reader_of[y]]
        divs = [(i, n) for i, n in readers if n is not None and is_op(n, "Div")]
        products = [n for _, n in readers if n is not None and is_op(n, "Mul")]
        if len(divs) != 1 or len(products) != 1:
            return None
        div_index, div = divs[0]
        try:
            if div.input[0] != y or not self.scalar(div.input[1], math.sqrt(2.0)):
                return None
            erf_index, erf = self.only_reader(div.output[0], "Erf")
            one_index, one = self.only_reader(erf.output[0], "Add")
            if not self.scalar(self.other(one, erf.output[0]), 1.0):
                return None
            mul_index, mul = self.only_reader(one.output[0], "Mul")
            if mul is not products[0] or self.other(mul, one.output[0]) != y:
                return None
            half_index, half = self.only_reader(mul.output[0], "Mul")
            if not self.scalar(self.other(half, mul.output[0]), 0.5):
                return None
        except LookupError:
            return None
        return [div_index, erf_index, one_index, mul_index, half_index], half.output[0]

    def gelu_tanh(self, y: str) -> tuple[list[int], str] | None:
        """The nodes of ``(y * 0.5) * (1 + tanh(sqrt(2/pi) * (y + 0.044715
        * y**3)))`` over ``y`` (its only readers: the cube, the Add and the
        halving Mul) and the GELU's output name, or ``None``. The cube is a
        ``Pow(y, 3)``, as PyTorch exports it, or ``(y * y) * y``."""
        if y in self.outputs:
            return None
        found = self.cube_of(y)
        if found is None:
            return None
        cube_nodes, cubed = found
        others = set(self.reader_of[y]) - set(cube_nodes)
        readers = {
            n.op_type: (i, n)
            for i, n in ((i, self.nodes[i]) for i in others)
            if n is not None and not n.domain
        }
        if len(others) != 2 or set(readers) != {"Add", "Mul"}:
            return None
        add_index, add = readers["Add"]
        half_index, half = readers["Mul"]
        try:
            if not self.scalar(self.other(half, y), 0.5):
                return None
            cube_index, cube = self.only_reader(cubed, "Mul")
            if not self.scalar(self.other(cube, cubed), 0.044715):
                return None
            if self.only_reader(cube.output[0], "Add")[1] is not add:
                return None
            if self.other(add, cube.output[0]) != y:
                return None
            scale_index, scale = self.only_reader(add.output[0], "Mul")
            root = math.sqrt(2.0 / math.pi)
            if not self.scalar(self.other(scale, add.output[0]), root):
                return None
            tanh_index, tanh = self.only_reader(scale.output[0], "Tanh")
            one_index, one = self.only_reader(tanh.output[0], "Add")
            if not self.scalar(self.other(one, tanh.output[0]), 1.0):
                return None
            last_index, last = self.only_reader(one.output[0], "Mul")
            if self.other(last, one.output[0]) != half.output[0]:
                return None
            if self.only_reader(half.output[0], "Mul")[1] is not last:
                return None
        except LookupError:
            return None
        nodes = [*cube_nodes, cube_index, add_index, scale_index, tanh_index]
        return [*nodes, one_index, half_index, last_index], last.output[0]

    def cube_of(self, y: str) -> tuple[list[int], str] | None:
        """The nodes that alone compute ``y**3`` from ``y``, a ``Pow(y, 3)``
        or ``Mul(Mul(y, y), y)`` (factors in either order), and the cube's
        name; ``None`` where there is none."""
        for index in set(self.reader_of.get(y, [])):
            node = self.nodes[index]
            if node is None or node.domain:
                continue
            if (
                is_op(node, "Pow")
                and len(node.input) == 2
                and node.input[0] == y
                and self.scalar(node.input[1], 3.0)
            ):
                return [index], str(node.output[0])
            if is_op(node, "Mul") and list(node.input) == [y, y]:
                try:
                    outer_index, outer = self.only_reader(node.output[0], "Mul")
                    if self.other(outer, node.output[0]) == y:
                        return [index, outer_index], str(outer.output[0])
                except LookupError:
                    return None
        return None

    def layer_norm_of(self, tensor: str) -> tuple[int, onnx.NodeProto] | None:
        """The LayerNormalization (one output, default stash type) that reads
        ``tensor`` as its input, where exactly one does, and its index."""
        found = [
            (i, n)
            for i in self.reader_of.get(tensor, [])
            if (n := self.nodes[i]) is not None and is_op(n, "LayerNormalization")
        ]
        if len(found) != 1:
            return None
        index, norm = found[0]
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in norm.attribute}
        if (
            norm.input[0] != tensor
            or tensor in norm.input[1:]
            or len([o for o in norm.output if o]) != 1
            or not norm.output[0]
            or attrs.get("stash_type", 1) != 1
            or any(key not in ("axis", "epsilon", "stash_type") for key in attrs)
        ):
            return None
        return index, norm

    def add_layer_norm(self) -> int:
        count = 0
        for index, node in enumerate(self.nodes):
            if (
                node is None
                or not is_op(node, "Add")
                or len(node.input) != 2
                or len(node.output) != 1
            ):
                continue
            total = node.output[0]
            found = self.layer_norm_of(total)
            if found is None:
                continue
            norm_index, norm = found
            shared = self.readers[total] != 1 or total in self.outputs
            # A pre-LN block also reads the sum (the next residual): the
            # fused node keeps it as a second output, and takes the Add's
            # place, so its scale and bias must be made before the Add.
            if shared and any(
                name and self.producer.get(name, -1) > index for name in norm.input[1:]
            ):
                continue
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in norm.attribute}
            fused = onnx.helper.make_node(
                "AddLayerNormalization",
                [node.input[0], node.input[1], *norm.input[1:]],
                [norm.output[0], *([total] if shared else [])],
                name=norm.name,
                domain=PRIVATE_DOMAIN,
                axis=int(attrs.get("axis", -1)),
                epsilon=float(attrs.get("epsilon", 1e-5)),
            )
            if shared:
                self.nodes[index] = fused
                self.nodes[norm_index] = None
            else:
                self.nodes[norm_index] = fused
                self.nodes[index] = None
            count += 1
        return count

    def scale_add_softmax(self) -> int:
        count = 0
        for index, node in enumerate(self.nodes):
            if (
                node is None
                or not (is_op(node, "Div") or is_op(node, "Mul"))
                or len(node.input) != 2
            ):
                continue
            scale = self.const(node.input[1])
            if scale is None or scale.size != 1 or scale.dtype not in _FLOATS:
                continue
            mask_index: int | None = None
            inputs: list[str] = []
            attrs: dict[str, int] = {}
            try:  # scores without a mask
                soft_index, soft = self.only_reader(node.output[0], "Softmax")
            except LookupError:
                try:
                    mask_index, inputs, attrs = self.mask_of(node.output[0])
                    soft_index, soft = self.only_reader(
                        self.nodes_output(mask_index), "Softmax"
                    )
                except LookupError:
                    continue
            axis = next(
                (onnx.helper.get_attribute_value(a) for a in soft.attribute), -1
            )
            if len(soft.attribute) > 1 or axis != -1:
                continue
            fused = onnx.helper.make_node(
                "ScaleWhereSoftmax" if "keep" in attrs else "ScaleAddSoftmax",
                [node.input[0], node.input[1], *inputs],
                [soft.output[0]],
                name=soft.name,
                domain=PRIVATE_DOMAIN,
                divide=int(is_op(node, "Div")),
            )
            fused.attribute.extend(
                onnx.helper.make_attribute(key, value) for key, value in attrs.items()
            )
            self.nodes[soft_index] = fused
            self.nodes[index] = None
            if mask_index is not None:
                self.nodes[mask_index] = None
            count += 1 if mask_index is None else 2
        return count

    def squeeze_excitations(self) -> int:
        count = 0
        for index, node in enumerate(self.nodes):
            if node is None or not is_op(node, "GlobalAveragePool"):
                continue
            x = str(node.input[0])
            try:
                first_index, first = self.only_reader(node.output[0], "Conv")
                hidden, absorbed = str(first.output[0]), [index, first_index]
                if self.activations.get(hidden) != "relu":  # (not folded in)
                    relu_index, relu = self.only_reader(hidden, "Relu")
                    hidden = str(relu.output[0])
                    absorbed.append(relu_index)
                second_index, second = self.only_reader(hidden, "Conv")
                gate_index, gate_node, gate = self.gate(second.output[0])
                mul_index, mul = self.only_reader(gate_node.output[0], "Mul")
                if self.other(mul, gate_node.output[0]) != x:
                    continue
            except LookupError:
                continue
            if not (self.pointwise(first) and self.pointwise(second)):
                continue
            fused = onnx.helper.make_node(
                "SqueezeExcite",
                [x, *first.input[1:3], *second.input[1:3]],
                [mul.output[0]],
                name=mul.name,
                domain=PRIVATE_DOMAIN,
                **gate,
            )
            self.nodes[mul_index] = fused
            absorbed += [second_index, gate_index]
            for position in absorbed:
                self.nodes[position] = None
            count += len(absorbed)
        return count

    def gated_pointwise(self) -> int:
        count = 0
        names = {n for node in self.nodes if node is not None for n in node.output}
        names |= set(self.reader_of) | {i.name for i in self.graph.initializer}
        names |= {i.name for i in self.graph.input}
        for index, node in enumerate(self.nodes):
            if node is None or node.op_type != "SqueezeExcite":
                continue
            try:
                conv_index, conv = self.only_reader(node.output[0], "Conv")
            except LookupError:
                continue
            weights = self.const(conv.input[1]) if len(conv.input) > 1 else None
            if not self.pointwise(conv) or weights is None:
                continue
            if weights.dtype != np.float32:
                continue
            gates = unique_name(str(node.output[0]) + "_gates", names)
            squeeze = onnx.helper.make_node(
                "SqueezeGates",
                list(node.input),
                [gates],
                name=node.name,
                domain=PRIVATE_DOMAIN,
            )
            squeeze.attribute.extend(node.attribute)
            gated = onnx.helper.make_node(
                "GatedPointwise",
                [node.input[0], gates, *conv.input[1:3]],
                [conv.output[0]],
                name=conv.name,
                domain=PRIVATE_DOMAIN,
                activation=self.activations.get(conv.output[0], "none"),
            )
            self.nodes[index] = squeeze
            self.nodes[conv_index] = gated
            count += 1
        return count

    def residual_adds(self) -> int:
        count = 0
        for index, node in enumerate(self.nodes):
            if node is None or not is_op(node, "Add") or len(node.input) != 2:
                continue
            for product, residual in (node.input, node.input[::-1]):
                fused = self.with_residual(product, residual)
                if fused is not None:
                    break
            else:
                continue
            producer, inputs, op_type = fused
            absorbed = [producer, index]
            output, activation = str(node.output[0]), "none"
            try:
                relu_index, relu = self.only_reader(output, "Relu")
                output, activation = str(relu.output[0]), "relu"
                absorbed.append(relu_index)
            except LookupError:
                pass
            for position in absorbed:
                self.nodes[position] = None
            self.nodes[absorbed[-1]] = onnx.helper.make_node(
                op_type,
                inputs,
                [output],
                name=node.name,
                domain=PRIVATE_DOMAIN,
                activation=activation,
            )
            count += len(absorbed) - 1
        return count

    def with_residual(
        self, product: str, residual: str
    ) -> tuple[int, list[str], str] | None:
        """Where ``product`` is read by its Add alone and made by a 1 x 1
        convolution that applies no activation (a Conv as
        :meth:`pointwise` has it, float32 weights, or a
        ``GatedPointwise``): its index, the fused node's inputs (with
        ``residual`` last) and op type."""
        if product == residual or self.readers[product] != 1:
            return None
        if product in self.outputs or product not in self.producer:
            return None
        index = self.producer[product]
        node = self.nodes[index]
        if node is None or self.activations.get(product, "none") != "none":
            return None
        if node.op_type == "GatedPointwise" and len(node.input) == 4:
            given = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            if given.get("activation", b"none") not in (b"none", "none"):
                return None
            return index, [*node.input, residual], "GatedPointwise"
        if not is_op(node, "Conv") or not self.pointwise(node):
            return None
        weights = self.const(node.input[1])
        if weights is None or weights.dtype != np.float32:
            return None
        return index, [*node.input, residual], "PointwiseResidual"

    def pointwise_depthwise(self) -> int:
        count = 0
        for index, node in enumerate(self.nodes):
            if node is None or not is_op(node, "Conv") or not self.pointwise(node):
                continue
            weights = self.const(node.input[1])
            if weights is None or weights.ndim != 4 or weights.dtype != np.float32:
                continue
            try:
                depthwise_index, depthwise = self.only_reader(node.output[0], "Conv")
            except LookupError:
                continue
            window = self.depthwise_window(depthwise, node)
            if window is None:
                continue
            fused = onnx.helper.make_node(
                "PointwiseDepthwise",
                [node.input[0], *node.input[1:3], *depthwise.input[1:3]],
                [depthwise.output[0]],
                name=depthwise.name,
                domain=PRIVATE_DOMAIN,
                pointwise_activation=self.activations.get(node.output[0], "none"),
                activation=self.activations.get(depthwise.output[0], "none"),
                **window,
            )
            self.nodes[depthwise_index] = fused
            self.nodes[index] = None
            count += 1
        return count

    def depthwise_window(
        self, conv: onnx.NodeProto, pointwise: onnx.NodeProto
    ) -> dict[str, Any] | None:
        """``conv``'s window attributes where it is a 2-D depthwise
        convolution of ``pointwise``'s output (one group a channel,
        float32 constant weights and bias, explicit pads or none), else
        ``None``."""
        if len(conv.input) != 3 or not all(conv.input):
            return None
        weights, bias = self.const(conv.input[1]), self.const(conv.input[2])
        expanded = self.const(pointwise.input[1])
        if weights is None or bias is None or expanded is None:
            return None
        channels = int(expanded.shape[0])
        if weights.ndim != 4 or weights.shape[:2] != (channels, 1):
            return None
        if weights.dtype != np.float32 or bias.shape != (channels,):
            return None
        given = {a.name: onnx.helper.get_attribute_value(a) for a in conv.attribute}
        if given.get("group") != channels or given.get("auto_pad", b"NOTSET") not in (
            b"NOTSET",
            "NOTSET",
        ):
            return None
        if set(given) - {
            "group",
            "auto_pad",
            "kernel_shape",
            "strides",
            "pads",
            "dilations",
        }:
            return None
        kernel = [int(k) for k in given.get("kernel_shape", weights.shape[2:])]
        if kernel != list(weights.shape[2:]):
            return None
        return {
            "kernel_shape": kernel,
            "strides": [int(v) for v in given.get("strides", [1, 1])],
            "pads": [int(v) for v in given.get("pads", [0, 0, 0, 0])],
            "dilations": [int(v) for v in given.get("dilations", [1, 1])],
        }

    def gate(self, y: str) -> tuple[int, onnx.NodeProto, dict[str, Any]]:
        """The ``HardSigmoid`` or ``Sigmoid`` that alone reads ``y``: its
        index, the node and ``SqueezeExcite``'s attributes for it."""
        try:
            index, node = self.only_reader(y, "HardSigmoid")
        except LookupError:
            index, node = self.only_reader(y, "Sigmoid")
            return index, node, {"gate": "sigmoid", "alpha": 1.0, "beta": 0.0}
        given = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        alpha, beta = float(given.get("alpha", 0.2)), float(given.get("beta", 0.5))
        return index, node, {"gate": "hard_sigmoid", "alpha": alpha, "beta": beta}

    def pointwise(self, conv: onnx.NodeProto) -> bool:
        """Whether ``conv`` is a 1 x 1 convolution of one group, no pads,
        strides or dilations, with constant weights and bias."""
        if len(conv.input) != 3 or not all(conv.input):
            return False
        weights, bias = self.const(conv.input[1]), self.const(conv.input[2])
        if weights is None or bias is None or weights.ndim < 3:
            return False
        if any(size != 1 for size in weights.shape[2:]) or weights.dtype not in _FLOATS:
            return False
        given = {a.name: onnx.helper.get_attribute_value(a) for a in conv.attribute}
        plain: dict[str, Callable[[Any], bool]] = {
            "group": lambda v: v == 1,
            "auto_pad": lambda v: v in (b"NOTSET", b"VALID", "NOTSET", "VALID"),
            "kernel_shape": lambda v: all(k == 1 for k in v),
            "strides": lambda v: all(k == 1 for k in v),
            "dilations": lambda v: all(k == 1 for k in v),
            "pads": lambda v: not any(v),
        }
        return all(key in plain and plain[key](value) for key, value in given.items())

    def nodes_output(self, index: int) -> str:
        node = self.nodes[index]
        assert node is not None
        return str(node.output[0])

    def mask_of(self, scores: str) -> tuple[int, list[str], dict[str, int]]:
        """The node that alone reads attention's scaled ``scores`` and masks
        them: an ``Add(M)`` (its index, ``[M]``, no attributes) or a
        ``Where(K, scores, F)`` / ``Where(K, F, scores)`` with ``F`` a
        constant scalar (``[K, F]``, ``keep``); raises ``LookupError``
        where there is none."""
        try:
            index, add = self.only_reader(scores, "Add")
            return index, [self.other(add, scores)], {}
        except LookupError:
            index, where = self.only_reader(scores, "Where")
        condition, *branches = where.input
        if len(branches) != 2 or scores == condition or branches.count(scores) != 1:
            raise LookupError(scores)
        keep = branches[0] == scores
        fill = str(branches[1] if keep else branches[0])
        value = self.const(fill)
        if value is None or value.size != 1 or value.dtype not in _FLOATS:
            raise LookupError(scores)
        return index, [str(condition), fill], {"keep": int(keep)}

    def perm(self, node: onnx.NodeProto) -> list[int] | None:
        """A Transpose's explicit permutation (``None`` without one: the
        default reverses axes of a rank the rewrite does not know)."""
        for attribute in node.attribute:
            if attribute.name == "perm":
                return [int(v) for v in attribute.ints]
        return None

    def transpose_before(self, tensor: str, reader: int) -> tuple[int, list[int]]:
        """The Transpose with an explicit permutation that makes ``tensor``,
        read only by node ``reader`` (raises ``LookupError`` where there
        is none)."""
        index = self.producer.get(tensor)
        node = None if index is None else self.nodes[index]
        if (
            index is None
            or node is None
            or not is_op(node, "Transpose")
            or tensor in self.outputs
            or self.reader_of.get(tensor) != [reader]
        ):
            raise LookupError(tensor)
        perm = self.perm(node)
        if perm is None or len(perm) < 2:
            raise LookupError(tensor)
        return index, perm

    def compose_transposes(self) -> int:
        count = 0
        for index, node in enumerate(self.nodes):
            if node is None or not is_op(node, "Transpose"):
                continue
            outer = self.perm(node)
            try:
                inner_index, inner = self.transpose_before(node.input[0], index)
            except LookupError:
                continue
            first = self.nodes[inner_index]
            if outer is None or first is None or len(outer) != len(inner):
                continue
            composed = [inner[axis] for axis in outer]
            source = first.input[0]
            self.nodes[index] = onnx.helper.make_node(
                "Transpose", [source], [node.output[0]], name=node.name, perm=composed
            )
            self.nodes[inner_index] = None
            self.producer[node.output[0]] = index
            self.reader_of[source] = [
                index if i == inner_index else i for i in self.reader_of[source]
            ]
            count += 1
        return count

    def transposed_matmuls(self) -> int:
        count = 0
        for index, node in enumerate(self.nodes):
            if node is None or not is_op(node, "MatMul") or len(node.input) != 2:
                continue
            inputs, absorbed = list(node.input), []
            perms: dict[str, list[int]] = {}
            for position, key in ((0, "perm_a"), (1, "perm_b")):
                if node.input[0] == node.input[1]:
                    break  # one tensor read twice: not only by this node
                try:
                    found, perm = self.transpose_before(node.input[position], index)
                except LookupError:
                    continue
                source = self.nodes[found]
                if source is None:
                    continue
                inputs[position] = source.input[0]
                perms[key] = perm
                absorbed.append(found)
            output = node.output[0]
            try:
                after_index, after = self.only_reader(output, "Transpose")
                out_perm = self.perm(after)
                if out_perm is not None and len(out_perm) >= 2:
                    perms["perm_out"] = out_perm
                    absorbed.append(after_index)
                    output = after.output[0]
            except LookupError:
                pass
            if not absorbed:
                continue
            fused = onnx.helper.make_node(
                "TransposedMatMul",
                inputs,
                [output],
                name=node.name,
                domain=PRIVATE_DOMAIN,
            )
            fused.attribute.extend(
                onnx.helper.make_attribute(key, value) for key, value in perms.items()
            )
            # at the later of the MatMul and its output's Transpose: every
            # input is made before either
            self.nodes[index] = None
            for position in absorbed:
                self.nodes[position] = None
            self.nodes[max(index, *absorbed)] = fused
            count += len(absorbed)
        return count

    def commit(self) -> None:
        kept = [node for node in self.nodes if node is not None]
        copies = [onnx.NodeProto() for _ in kept]
        for target, node in zip(copies, kept, strict=True):
            target.CopyFrom(node)
        del self.graph.node[:]
        self.graph.node.extend(copies)
