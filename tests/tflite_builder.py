"""A small writer of int8 ``.tflite`` flatbuffers for tests (the ``tflite`` package's generated
builder functions; no TensorFlow), the LiteRT reference-interpreter oracle, and a seeded random
model generator.

    m = TfliteBuilder()
    x = m.input([1, 8, 8, 3], scale=0.05, zero_point=-3)
    y = m.conv_2d(x, out_channels=4, kernel=(3, 3), stride=(2, 2), padding="SAME", activation="RELU")
    m.output(m.softmax(m.fully_connected(m.reshape(y, [1, -1]), 10)))
    data = m.finish()   # bytes of a .tflite model
"""
from __future__ import annotations

import importlib

import numpy as np

INT8, INT16, INT32, INT64, FLOAT32 = 9, 7, 2, 4, 0
ACT = {"NONE": 0, "RELU": 1, "RELU_N1_TO_1": 2, "RELU6": 3}
PAD = {"SAME": 0, "VALID": 1}


def _mod(name):
    return importlib.import_module(f"tflite.{name}")


class _T:
    def __init__(self, index, shape, scale, zero_point, dtype=INT8):
        self.index, self.shape, self.scale, self.zero_point, self.dtype = index, list(shape), scale, zero_point, dtype


class TfliteBuilder:
    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.tensors: list[dict] = []
        self.buffers: list[bytes] = [b""]
        self.ops: list[tuple] = []
        self.inputs: list[int] = []
        self.outputs: list[int] = []
        self.codes: list[str] = []

    # ------------------------------------------------------------------ tensors
    def tensor(self, shape, dtype=INT8, scale=None, zero_point=0, data=None, name=None, qdim=0) -> _T:
        buf = 0
        if data is not None:
            self.buffers.append(np.ascontiguousarray(data).tobytes())
            buf = len(self.buffers) - 1
        scales = None if scale is None else np.atleast_1d(np.asarray(scale, np.float32))
        zps = None if scale is None else np.atleast_1d(np.asarray(zero_point, np.int64))
        if zps is not None and len(zps) != len(scales):
            zps = np.zeros(len(scales), np.int64) + zps[0]
        self.tensors.append({"shape": [int(d) for d in shape], "type": dtype, "buffer": buf, "scales": scales,
                             "zps": zps, "qdim": qdim, "name": name or f"t{len(self.tensors)}"})
        return _T(len(self.tensors) - 1, shape, None if scales is None else float(scales[0]),
                  None if zps is None else int(zps[0]), dtype)

    def act(self, shape, scale, zero_point, dtype=None) -> _T:
        return self.tensor(shape, dtype or self.act_type, scale, 0 if (dtype or self.act_type) == INT16 else zero_point)

    act_type = INT8  # INT16: the 16x8 scheme (int16 activations, zero point 0, int64 biases)

    def input(self, shape, scale=0.05, zero_point=0) -> _T:
        t = self.act(shape, scale, zero_point)
        self.inputs.append(t.index)
        return t

    def output(self, t: _T) -> _T:
        self.outputs.append(t.index)
        return t

    def op(self, code: str, inputs, outputs, options: str | None = None, **fields) -> None:
        if code not in self.codes:
            self.codes.append(code)
        self.ops.append((self.codes.index(code), [i.index if isinstance(i, _T) else i for i in inputs],
                         [o.index for o in outputs], options, fields))

    # ------------------------------------------------------------------ layers (random weights)
    def _out_q(self, t: _T, spread: float = 1.0):
        return float(t.scale * spread * self.rng.uniform(0.5, 2.0)), int(self.rng.integers(-20, 21))

    def _bias_tensor(self, x: _T, wscale, n):
        if self.act_type == INT16:
            return self.tensor([n], INT64, x.scale * wscale, 0, self.rng.integers(-300000, 300000, n, dtype=np.int64))
        return self.tensor([n], INT32, x.scale * wscale, 0, self.rng.integers(-3000, 3000, n, dtype=np.int32))

    def conv_2d(self, x: _T, out_channels, kernel=(3, 3), stride=(1, 1), padding="SAME", activation="NONE",
                dilation=(1, 1), per_channel=True, bias=True, out_q=None) -> _T:
        n, h, w, c = x.shape
        kh, kw = kernel
        wdata = self.rng.integers(-127, 128, (out_channels, kh, kw, c), dtype=np.int8)
        wscale = self.rng.uniform(0.002, 0.02, out_channels if per_channel else 1)
        wt = self.tensor(wdata.shape, INT8, wscale, 0, wdata, qdim=0)
        b = self._bias_tensor(x, wscale, out_channels) if bias else -1
        oh, ow = _out(h, kh, stride[0], dilation[0], padding), _out(w, kw, stride[1], dilation[1], padding)
        s, zp = out_q or self._out_q(x, float(np.sqrt(kh * kw * c)) * 0.01 * 127 * 0.3)
        y = self.act([n, oh, ow, out_channels], s, zp)
        self.op("CONV_2D", [x, wt, b], [y], "Conv2DOptions", Padding=PAD[padding], StrideW=stride[1],
                StrideH=stride[0], FusedActivationFunction=ACT[activation], DilationWFactor=dilation[1],
                DilationHFactor=dilation[0])
        return y

    def depthwise_conv_2d(self, x: _T, multiplier=1, kernel=(3, 3), stride=(1, 1), padding="SAME",
                          activation="NONE", dilation=(1, 1), per_channel=True) -> _T:
        n, h, w, c = x.shape
        cout = c * multiplier
        kh, kw = kernel
        wdata = self.rng.integers(-127, 128, (1, kh, kw, cout), dtype=np.int8)
        wscale = self.rng.uniform(0.002, 0.02, cout if per_channel else 1)
        wt = self.tensor(wdata.shape, INT8, wscale, 0, wdata, qdim=3)
        b = self._bias_tensor(x, wscale, cout)
        oh, ow = _out(h, kh, stride[0], dilation[0], padding), _out(w, kw, stride[1], dilation[1], padding)
        s, zp = self._out_q(x, float(np.sqrt(kh * kw)) * 0.01 * 127 * 0.3)
        y = self.act([n, oh, ow, cout], s, zp)
        self.op("DEPTHWISE_CONV_2D", [x, wt, b], [y], "DepthwiseConv2DOptions", Padding=PAD[padding],
                StrideW=stride[1], StrideH=stride[0], DepthMultiplier=multiplier,
                FusedActivationFunction=ACT[activation], DilationWFactor=dilation[1], DilationHFactor=dilation[0])
        return y

    def fully_connected(self, x: _T, units, activation="NONE", per_channel=False) -> _T:
        k = x.shape[-1]
        rows = int(np.prod(x.shape)) // k
        wdata = self.rng.integers(-127, 128, (units, k), dtype=np.int8)
        wscale = self.rng.uniform(0.002, 0.02, units if per_channel else 1)
        wt = self.tensor(wdata.shape, INT8, wscale, 0, wdata, qdim=0)
        b = self._bias_tensor(x, wscale, units)
        s, zp = self._out_q(x, float(np.sqrt(k)) * 0.01 * 127 * 0.3)
        y = self.act([rows, units], s, zp)
        self.op("FULLY_CONNECTED", [x, wt, b], [y], "FullyConnectedOptions", FusedActivationFunction=ACT[activation])
        return y

    def binary(self, code: str, a: _T, b: _T, activation="NONE") -> _T:
        shape = list(np.broadcast_shapes(tuple(a.shape), tuple(b.shape)))
        s, zp = self._out_q(a, 1.5)
        y = self.act(shape, s, zp)
        self.op(code, [a, b], [y], {"ADD": "AddOptions", "SUB": "SubOptions", "MUL": "MulOptions"}[code],
                FusedActivationFunction=ACT[activation])
        return y

    def const_act(self, shape, scale=0.04, zero_point=3) -> _T:
        return self.tensor(shape, INT8, scale, zero_point, self.rng.integers(-128, 128, shape, dtype=np.int8))

    def pool(self, code: str, x: _T, kernel=(2, 2), stride=(2, 2), padding="VALID", activation="NONE") -> _T:
        n, h, w, c = x.shape
        y = self.act([n, _out(h, kernel[0], stride[0], 1, padding), _out(w, kernel[1], stride[1], 1, padding), c],
                     x.scale, x.zero_point)
        self.op(code, [x], [y], "Pool2DOptions", Padding=PAD[padding], StrideW=stride[1], StrideH=stride[0],
                FilterWidth=kernel[1], FilterHeight=kernel[0], FusedActivationFunction=ACT[activation])
        return y

    def softmax(self, x: _T, beta=1.0) -> _T:
        y = self.act(x.shape, 1.0 / 256, -128)
        self.op("SOFTMAX", [x], [y], "SoftmaxOptions", Beta=beta)
        return y

    def reshape(self, x: _T, shape) -> _T:
        shape = list(np.empty(x.shape).reshape(shape).shape)
        st = self.tensor([len(shape)], INT32, data=np.asarray(shape, np.int32))
        y = self.act(shape, x.scale, x.zero_point)
        self.op("RESHAPE", [x, st], [y], None)
        return y

    def transpose(self, x: _T, perm) -> _T:
        pt = self.tensor([len(perm)], INT32, data=np.asarray(perm, np.int32))
        y = self.act([x.shape[p] for p in perm], x.scale, x.zero_point)
        self.op("TRANSPOSE", [x, pt], [y], None)
        return y

    def strided_slice(self, x: _T, begin, end, strides) -> _T:
        ts = [self.tensor([len(v)], INT32, data=np.asarray(v, np.int32)) for v in (begin, end, strides)]
        shape = list(np.empty(x.shape)[tuple(slice(b, e, s) for b, e, s in zip(begin, end, strides))].shape)
        y = self.act(shape, x.scale, x.zero_point)
        self.op("STRIDED_SLICE", [x, *ts], [y], "StridedSliceOptions")
        return y

    def concatenation(self, xs, axis) -> _T:
        shape = list(np.concatenate([np.empty(x.shape) for x in xs], axis).shape)
        y = self.act(shape, xs[0].scale, xs[0].zero_point)
        self.op("CONCATENATION", xs, [y], "ConcatenationOptions", Axis=axis)
        return y

    def pad(self, x: _T, pads) -> _T:
        pt = self.tensor([len(pads), 2], INT32, data=np.asarray(pads, np.int32))
        y = self.act([d + a + b for d, (a, b) in zip(x.shape, pads)], x.scale, x.zero_point)
        self.op("PAD", [x, pt], [y], "PadOptions")
        return y

    def relu(self, code: str, x: _T) -> _T:
        y = self.act(x.shape, *self._out_q(x, 0.7))
        self.op(code, [x], [y], None)
        return y

    def unary(self, code: str, x: _T, out_q=None, options: str | None = None, **fields) -> _T:
        y = self.act(x.shape, *(out_q or self._out_q(x, 0.7)))
        self.op(code, [x], [y], options, **fields)
        return y

    def reduce(self, code: str, x: _T, axes, keep_dims=False, out_q=None) -> _T:
        at = self.tensor([len(axes)], INT32, data=np.asarray(axes, np.int32))
        shape = list(np.empty(x.shape).mean(axis=tuple(axes), keepdims=keep_dims).shape)
        y = self.act(shape, *(out_q or ((x.scale, x.zero_point) if code.startswith("REDUCE") else
                                        self._out_q(x, 0.5))))
        self.op(code, [x, at], [y], "ReducerOptions", KeepDims=keep_dims)
        return y

    def batch_matmul(self, a: _T, b: _T, adj_x=False, adj_y=False) -> _T:
        sa = list(a.shape[:-2]) + ([a.shape[-1], a.shape[-2]] if adj_x else a.shape[-2:])
        sb = list(b.shape[:-2]) + ([b.shape[-1], b.shape[-2]] if adj_y else b.shape[-2:])
        shape = list(np.matmul(np.zeros(sa), np.zeros(sb)).shape)
        y = self.act(shape, *self._out_q(a, float(np.sqrt(sa[-1])) * 3))
        self.op("BATCH_MATMUL", [a, b], [y], "BatchMatMulOptions", AdjX=adj_x, AdjY=adj_y)
        return y

    def requantize(self, x: _T) -> _T:
        y = self.act(x.shape, *self._out_q(x, 1.3))
        self.op("QUANTIZE", [x], [y], None)
        return y

    # ------------------------------------------------------------------ the flatbuffer
    def finish(self) -> bytes:
        import flatbuffers
        import tflite
        from tflite.BuiltinOperator import BuiltinOperator
        from tflite.BuiltinOptions import BuiltinOptions

        fb = flatbuffers.Builder(1024)

        def ivec(start, values, kind="int32"):
            start(fb, len(values))
            for v in reversed(values):
                getattr(fb, "PrependInt32" if kind == "int32" else "PrependInt64")(int(v))
            return fb.EndVector()

        T, Q, B, O, OC, SG, M = (_mod(n) for n in ("Tensor", "QuantizationParameters", "Buffer", "Operator",
                                                      "OperatorCode", "SubGraph", "Model"))
        bufs = []
        for data in self.buffers:
            d = fb.CreateByteVector(data) if data else None
            B.BufferStart(fb)
            if d is not None:
                B.BufferAddData(fb, d)
            bufs.append(B.BufferEnd(fb))
        tens = []
        for t in self.tensors:
            name = fb.CreateString(t["name"])
            shape = ivec(T.TensorStartShapeVector, t["shape"])
            q = None
            if t["scales"] is not None:
                Q.QuantizationParametersStartScaleVector(fb, len(t["scales"]))
                for v in reversed(t["scales"]):
                    fb.PrependFloat32(float(v))
                sc = fb.EndVector()
                zp = ivec(Q.QuantizationParametersStartZeroPointVector, list(t["zps"]), "int64")
                Q.QuantizationParametersStart(fb)
                Q.QuantizationParametersAddScale(fb, sc)
                Q.QuantizationParametersAddZeroPoint(fb, zp)
                Q.QuantizationParametersAddQuantizedDimension(fb, t["qdim"])
                q = Q.QuantizationParametersEnd(fb)
            T.TensorStart(fb)
            T.TensorAddShape(fb, shape)
            T.TensorAddType(fb, t["type"])
            T.TensorAddBuffer(fb, t["buffer"])
            T.TensorAddName(fb, name)
            if q is not None:
                T.TensorAddQuantization(fb, q)
            tens.append(T.TensorEnd(fb))
        ops = []
        for code, ins, outs, opt_name, fields in self.ops:
            opt = None
            if opt_name:
                om = _mod(opt_name)
                getattr(om, f"{opt_name}Start")(fb)
                for k, v in fields.items():
                    getattr(om, f"{opt_name}Add{k}")(fb, v)
                opt = getattr(om, f"{opt_name}End")(fb)
            iv = ivec(O.OperatorStartInputsVector, ins)
            ov = ivec(O.OperatorStartOutputsVector, outs)
            O.OperatorStart(fb)
            O.OperatorAddOpcodeIndex(fb, code)
            O.OperatorAddInputs(fb, iv)
            O.OperatorAddOutputs(fb, ov)
            if opt is not None:
                O.OperatorAddBuiltinOptionsType(fb, getattr(BuiltinOptions, opt_name))
                O.OperatorAddBuiltinOptions(fb, opt)
            ops.append(O.OperatorEnd(fb))
        codes = []
        for name in self.codes:
            c = getattr(BuiltinOperator, name)
            OC.OperatorCodeStart(fb)
            OC.OperatorCodeAddDeprecatedBuiltinCode(fb, min(c, 127))
            OC.OperatorCodeAddBuiltinCode(fb, c)
            OC.OperatorCodeAddVersion(fb, 1)
            codes.append(OC.OperatorCodeEnd(fb))

        def offvec(start, items):
            start(fb, len(items))
            for it in reversed(items):
                fb.PrependUOffsetTRelative(it)
            return fb.EndVector()

        tv = offvec(SG.SubGraphStartTensorsVector, tens)
        ov = offvec(SG.SubGraphStartOperatorsVector, ops)
        inv = ivec(SG.SubGraphStartInputsVector, self.inputs)
        outv = ivec(SG.SubGraphStartOutputsVector, self.outputs)
        SG.SubGraphStart(fb)
        SG.SubGraphAddTensors(fb, tv)
        SG.SubGraphAddOperators(fb, ov)
        SG.SubGraphAddInputs(fb, inv)
        SG.SubGraphAddOutputs(fb, outv)
        sg = SG.SubGraphEnd(fb)
        sgv = offvec(M.ModelStartSubgraphsVector, [sg])
        cv = offvec(M.ModelStartOperatorCodesVector, codes)
        bv = offvec(M.ModelStartBuffersVector, bufs)
        desc = fb.CreateString("corten test model")
        M.ModelStart(fb)
        M.ModelAddVersion(fb, 3)
        M.ModelAddOperatorCodes(fb, cv)
        M.ModelAddSubgraphs(fb, sgv)
        M.ModelAddBuffers(fb, bv)
        M.ModelAddDescription(fb, desc)
        fb.Finish(M.ModelEnd(fb), file_identifier=b"TFL3")
        del tflite
        return bytes(fb.Output())


def _out(size, k, stride, dilation, padding):
    eff = (k - 1) * dilation + 1
    return (size + stride - 1) // stride if padding == "SAME" else (size + stride - eff) // stride


# ----------------------------------------------------------------------------- the oracle
def litert_outputs(model: bytes, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """LiteRT's reference kernels (``BUILTIN_REF``) on ``inputs`` (int8, TFLite shapes)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    it = Interpreter(model_content=model, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]


def random_input(shape, rng) -> np.ndarray:
    return rng.integers(-128, 128, shape, dtype=np.int8)


# ----------------------------------------------------------------------------- random models
def random_model(seed: int) -> bytes:
    """A random small int8 CNN/MLP from the supported operators (seeded)."""
    m = TfliteBuilder(seed)
    random_chain(m, seed)
    return m.finish()


def random_models(seeds) -> bytes:
    """The random models of ``seeds`` side by side in one .tflite file: one input and one output
    each, nothing shared (one conversion and one export for several models)."""
    m = TfliteBuilder(int(seeds[0]))
    for seed in seeds:
        random_chain(m, int(seed))
    return m.finish()


def random_chain(m: TfliteBuilder, seed: int) -> None:
    """Add the random model of ``seed`` (an input, 1-4 random layers, maybe fc + softmax, an output)."""
    rng = np.random.default_rng(seed)
    m.rng = np.random.default_rng(seed)
    h, w = int(rng.integers(3, 11)), int(rng.integers(3, 11))
    c = int(rng.integers(1, 6))
    x = m.input([1, h, w, c], float(rng.uniform(0.01, 0.1)), int(rng.integers(-30, 31)))
    acts = ["NONE", "RELU", "RELU6", "RELU_N1_TO_1"]
    for _ in range(int(rng.integers(1, 5))):
        kind = rng.choice(["conv", "dw", "pool", "add", "mul", "sub", "pad", "concat", "relu", "slice", "requant",
                           "act", "mean"])
        n, h, w, c = x.shape
        pad = str(rng.choice(["SAME", "VALID"]))
        k = (int(rng.integers(1, min(h, 3) + 1)), int(rng.integers(1, min(w, 3) + 1)))
        s = (int(rng.integers(1, 3)), int(rng.integers(1, 3)))
        act = str(rng.choice(acts))
        if kind == "conv":
            x = m.conv_2d(x, int(rng.integers(1, 7)), k, s, pad, act, per_channel=bool(rng.integers(2)))
        elif kind == "dw":
            x = m.depthwise_conv_2d(x, int(rng.integers(1, 3)), k, s, pad, act)
        elif kind == "pool":
            x = m.pool(str(rng.choice(["AVERAGE_POOL_2D", "MAX_POOL_2D"])), x, k, s, pad, act)
        elif kind in ("add", "mul", "sub"):
            other = m.const_act([c] if rng.integers(2) else [1, h, w, c], float(rng.uniform(0.01, 0.1)),
                                int(rng.integers(-20, 21)))
            x = m.binary(kind.upper(), x, other, act)
        elif kind == "pad":
            x = m.pad(x, [[0, 0], [int(rng.integers(0, 2)), int(rng.integers(0, 2))],
                          [int(rng.integers(0, 2)), int(rng.integers(0, 2))], [0, 0]])
        elif kind == "concat":
            x = m.concatenation([x, x], int(rng.choice([1, 2, 3, -1])))
        elif kind == "relu":
            x = m.relu(str(rng.choice(["RELU", "RELU6", "RELU_N1_TO_1"])), x)
        elif kind == "slice":
            x = m.strided_slice(x, [0, 0, 0, 0], [1, h, w, max(1, c - 1)] if c > 1 else [1, h, w, 1], [1, 1, 2, 1])
        elif kind == "act":
            code = str(rng.choice(["LOGISTIC", "TANH", "HARD_SWISH", "LEAKY_RELU"]))
            fixed = {"LOGISTIC": (1 / 256, -128), "TANH": (1 / 128, 0)}.get(code)
            x = m.unary(code, x, fixed, "LeakyReluOptions" if code == "LEAKY_RELU" else None,
                        **({"Alpha": float(rng.uniform(0.01, 0.5))} if code == "LEAKY_RELU" else {}))
        elif kind == "mean":
            x = m.reduce(str(rng.choice(["MEAN", "REDUCE_MAX"])), x, [1, 2], True)
        else:
            x = m.requantize(x)
    if rng.integers(2):
        x = m.fully_connected(m.reshape(x, [1, -1]), int(rng.integers(2, 8)), str(rng.choice(acts[:3])),
                              per_channel=False)
        if rng.integers(2):
            x = m.softmax(x)
    m.output(x)
