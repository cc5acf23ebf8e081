"""Three models of families the test suite does not build, exported from
PyTorch (random weights, fixed seed, fixed shapes) for ``bench_models.py``:

* ``gpt``: a GPT-2-style decoder: token and position embeddings, 4 blocks
  of pre-norm causal self-attention (one fused QKV projection, 8 heads, a
  lower-triangular mask applied with ``where``) and an MLP whose GELU is
  GPT-2's own tanh form, ``0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715
  pow(x, 3))))``, then a final layer norm. Width 256, MLP 1024, vocabulary
  1024, at batch 4 x sequence 100.
* ``mnv3``: a MobileNetV3-Small-style CNN at batch 1, 224 x 224: a
  stride-2 stem with hard-swish, eleven inverted-residual blocks (1x1
  expansion, 3x3 or 5x5 depthwise convolution, squeeze-excitation with
  ReLU and hard-sigmoid, 1x1 projection, residual adds), batch norms
  (folded by the exporter), global pooling and a two-layer classifier.
* ``resnet18``: a ResNet-18-style CNN at batch 1, 224 x 224 (the issue's
  named CNN): a 7x7 stride-2 stem, max pooling, four stages of two basic
  blocks (3x3 convolutions, batch norms folded, ReLU, residual adds, 1x1
  stride-2 projections where the shape changes), global pooling and a
  linear classifier, in plain torch modules with random weights.

    .venv/bin/python bench/export_models.py            # writes bench/models/
    .venv/bin/python bench/export_models.py --check    # and compares with torch

PyTorch is a ``bench`` extra (``pip install -e '.[bench]'``), not a runtime
dependency; the ``.onnx`` files are generated (``bench/models/`` is not
committed). :func:`load` exports a model the first time it is asked for.
"""

from __future__ import annotations

import argparse
import io
import math
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODEL_DIR = HERE / "models"
#: name -> (input shapes, input dtypes) at the benchmark's fixed size
MODELS = ("gpt", "mnv3", "resnet18")
OPSET = 17
GPT = {"batch": 4, "seq": 100, "dim": 256, "heads": 8, "layers": 4, "vocab": 1024}


def _gpt_module() -> tuple[Any, tuple[Any, ...]]:
    import torch
    from torch import nn

    dim, heads, layers, vocab = GPT["dim"], GPT["heads"], GPT["layers"], GPT["vocab"]
    seq, batch = GPT["seq"], GPT["batch"]

    class NewGELU(nn.Module):
        """GPT-2's GELU, exactly as Hugging Face's ``NewGELUActivation``."""

        def forward(self, x: Any) -> Any:
            inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))
            return 0.5 * x * (1.0 + torch.tanh(inner))

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)
            mask = torch.tril(torch.ones(seq, seq, dtype=torch.bool))
            self.register_buffer("mask", mask.view(1, 1, seq, seq))

        def forward(self, x: Any) -> Any:
            b, s, _ = x.shape
            q, k, v = self.qkv(x).split(dim, dim=2)
            q, k, v = (
                t.view(b, s, heads, dim // heads).transpose(1, 2) for t in (q, k, v)
            )
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(dim // heads)
            mask = self.mask[:, :, :s, :s]
            scores = torch.where(mask, scores, torch.finfo(scores.dtype).min)
            att = torch.softmax(scores, dim=-1)
            y = torch.matmul(att, v).transpose(1, 2).reshape(b, s, dim)
            return self.proj(y)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.attn = Attention()
            self.mlp = nn.Sequential(
                nn.Linear(dim, 4 * dim), NewGELU(), nn.Linear(4 * dim, dim)
            )

        def forward(self, x: Any) -> Any:
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(vocab, dim)
            self.wpe = nn.Embedding(seq, dim)
            self.blocks = nn.Sequential(*(Block() for _ in range(layers)))
            self.ln_f = nn.LayerNorm(dim)

        def forward(self, ids: Any) -> Any:
            positions = torch.arange(ids.shape[1], device=ids.device)
            x = self.wte(ids) + self.wpe(positions)
            return self.ln_f(self.blocks(x))

    ids = torch.randint(
        0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0)
    )
    return Decoder(), (ids,)


# MobileNetV3-Small: kernel, expanded, out, SE, activation, stride
_MNV3_BLOCKS = (
    (3, 16, 16, True, "relu", 2),
    (3, 72, 24, False, "relu", 2),
    (3, 88, 24, False, "relu", 1),
    (5, 96, 40, True, "hswish", 2),
    (5, 240, 40, True, "hswish", 1),
    (5, 240, 40, True, "hswish", 1),
    (5, 120, 48, True, "hswish", 1),
    (5, 144, 48, True, "hswish", 1),
    (5, 288, 96, True, "hswish", 2),
    (5, 576, 96, True, "hswish", 1),
    (5, 576, 96, True, "hswish", 1),
)


def _mnv3_module() -> tuple[Any, tuple[Any, ...]]:
    import torch
    from torch import nn

    def act(name: str) -> Any:
        return nn.Hardswish() if name == "hswish" else nn.ReLU()

    def conv_bn(c_in: int, c_out: int, k: int, stride: int, groups: int = 1) -> Any:
        return [
            nn.Conv2d(c_in, c_out, k, stride, k // 2, groups=groups, bias=False),
            nn.BatchNorm2d(c_out),
        ]

    def _squeezed(channels: int) -> int:
        return max(8, (channels // 4 + 4) // 8 * 8)

    class SqueezeExcite(nn.Module):
        def __init__(self, channels: int) -> None:
            super().__init__()
            squeezed = _squeezed(channels)
            self.fc1 = nn.Conv2d(channels, squeezed, 1)
            self.fc2 = nn.Conv2d(squeezed, channels, 1)

        def forward(self, x: Any) -> Any:
            s = nn.functional.adaptive_avg_pool2d(x, 1)
            s = nn.functional.hardsigmoid(self.fc2(torch.relu(self.fc1(s))))
            return x * s

    class InvertedResidual(nn.Module):
        def __init__(self, c_in: int, spec: tuple[Any, ...]) -> None:
            super().__init__()
            k, expanded, c_out, se, name, stride = spec
            layers: list[Any] = []
            if expanded != c_in:
                layers += [*conv_bn(c_in, expanded, 1, 1), act(name)]
            layers += [*conv_bn(expanded, expanded, k, stride, expanded), act(name)]
            if se:
                layers.append(SqueezeExcite(expanded))
            layers += conv_bn(expanded, c_out, 1, 1)
            self.body = nn.Sequential(*layers)
            self.residual = stride == 1 and c_in == c_out

        def forward(self, x: Any) -> Any:
            y = self.body(x)
            return x + y if self.residual else y

    class MobileNetV3(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layers: list[Any] = [*conv_bn(3, 16, 3, 2), nn.Hardswish()]
            c = 16
            for spec in _MNV3_BLOCKS:
                layers.append(InvertedResidual(c, spec))
                c = spec[2]
            layers += [*conv_bn(c, 576, 1, 1), nn.Hardswish()]
            self.features = nn.Sequential(*layers)
            self.head = nn.Sequential(
                nn.Linear(576, 1024), nn.Hardswish(), nn.Linear(1024, 1000)
            )

        def forward(self, x: Any) -> Any:
            x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
            return self.head(torch.flatten(x, 1))

    model = MobileNetV3()
    _random_batch_norms(model)
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    return model, (x,)


def _resnet18_module() -> tuple[Any, tuple[Any, ...]]:
    import torch
    from torch import nn

    class BasicBlock(nn.Module):
        def __init__(self, c_in: int, c_out: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(c_out)
            self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(c_out)
            self.down: Any = None
            if stride != 1 or c_in != c_out:
                self.down = nn.Sequential(
                    nn.Conv2d(c_in, c_out, 1, stride, bias=False),
                    nn.BatchNorm2d(c_out),
                )

        def forward(self, x: Any) -> Any:
            y = torch.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            skip = x if self.down is None else self.down(x)
            return torch.relu(y + skip)

    class ResNet18(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layers: list[Any] = [
                nn.Conv2d(3, 64, 7, 2, 3, bias=False),
                nn.BatchNorm2d(64),
                nn.ReLU(),
                nn.MaxPool2d(3, 2, 1),
            ]
            c = 64
            for width, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
                layers += [BasicBlock(c, width, stride), BasicBlock(width, width, 1)]
                c = width
            self.features = nn.Sequential(*layers)
            self.fc = nn.Linear(512, 1000)

        def forward(self, x: Any) -> Any:
            x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
            return self.fc(torch.flatten(x, 1))

    model = ResNet18()
    _random_batch_norms(model)
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    return model, (x,)


def _random_batch_norms(model: Any) -> None:
    """Batch norms with statistics of their own, not the identity."""
    import torch
    from torch import nn

    generator = torch.Generator().manual_seed(1)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            n = module.num_features
            module.running_mean.copy_(0.1 * torch.randn(n, generator=generator))
            module.running_var.copy_(0.5 + torch.rand(n, generator=generator))
            module.weight.data.copy_(0.5 + torch.rand(n, generator=generator))
            module.bias.data.copy_(0.1 * torch.randn(n, generator=generator))


_MAKERS = {"gpt": _gpt_module, "mnv3": _mnv3_module, "resnet18": _resnet18_module}


def export(name: str) -> bytes:
    """The ONNX bytes of model ``name`` (PyTorch's TorchScript exporter,
    opset 17, constants folded).

    :raises KeyError: if there is no such model.
    """
    import torch

    torch.manual_seed(0)
    module, args = _MAKERS[name]()
    module.eval()
    buffer = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(
            module,
            args,
            buffer,
            input_names=["ids" if name == "gpt" else "x"],
            output_names=["y"],
            opset_version=OPSET,
            dynamo=False,
            do_constant_folding=True,
        )
    return buffer.getvalue()


def path_of(name: str) -> Path:
    """Where model ``name``'s ONNX file is generated."""
    return MODEL_DIR / f"{name}.onnx"


def load(name: str) -> Any:
    """Model ``name`` as an ``onnx.ModelProto``, exported on first use."""
    import onnx

    path = path_of(name)
    if not path.exists():
        MODEL_DIR.mkdir(exist_ok=True)
        path.write_bytes(export(name))
    return onnx.load(str(path))


def feed(name: str) -> dict[str, Any]:
    """The benchmark's input for model ``name`` (fixed seed)."""
    import numpy as np

    rng = np.random.default_rng(0)
    if name == "gpt":
        ids = rng.integers(0, GPT["vocab"], (GPT["batch"], GPT["seq"]))
        return {"ids": ids.astype(np.int64)}
    return {"x": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument(
        "--check", action="store_true", help="compare ONNX Runtime with torch"
    )
    a = ap.parse_args()
    for name in a.models.split(","):
        MODEL_DIR.mkdir(exist_ok=True)
        data = export(name)
        path_of(name).write_bytes(data)
        print(f"{path_of(name)}: {len(data) / 1e6:.1f} MB", file=sys.stderr)
        if a.check:
            import numpy as np
            import onnxruntime as ort
            import torch

            sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
            inputs = feed(name)
            got = sess.run(None, inputs)[0]
            torch.manual_seed(0)
            module, _ = _MAKERS[name]()
            module.eval()
            with torch.no_grad():
                want = module(*(torch.from_numpy(v) for v in inputs.values()))
            err = np.abs(got - want.numpy()).max() / np.abs(want.numpy()).max()
            print(f"{name}: ORT against torch, max rel err {err:.1e}", file=sys.stderr)


if __name__ == "__main__":
    main()
