"""One node of a real MXNet 1.9.1 parameter-server job (run by the workload venv, not the tool's).

The role comes from DMLC_ROLE, as in any MXNet job. A scheduler or server only imports mxnet (which
runs its ps-lite loop and then exits); a worker trains a small Gluon model with a `dist_*` kvstore.
Every node writes its own record (JSON) of what it did, with wall-clock ns timestamps:
- scheduler/server: role, pid, versions, start/end;
- worker: the same plus the model's parameters (kvstore key, shape, dtype, bytes), every kvstore call
  the Trainer made (init/broadcast/push/pull/pushpull/row_sparse_pull/set_optimizer) with the arrays
  involved, and every batch with its start/end.
A fault can be injected (lab/record.py's fault jobs): --stall-batch N --stall-s S makes a worker sleep S
seconds before batch N's trainer.step (its pushes leave late: a slow worker), and a server sleep S seconds
in its first update of training iteration N (--optimizer stallingsgd on the workers: stalling_sgd.py; every
answer of that round waits: a slow server); `fault` in the node's record says what it did and when.
The recorder (lab/record.py) reads `finished` to know when a straggler may be killed.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.metadata
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import numpy

DMLC_ENV_PREFIXES = ("DMLC_", "MXNET_", "PS_", "PORT")
STALL_ENV = "DLCSNIFF_LAB_STALL_UPDATE"       # stalling_sgd.STALL_ENV (that module imports mxnet)


def libzmq_version_inside_mxnet() -> str:
    """MXNet's libmxnet.so links libzmq statically and exports zmq_version."""
    spec = importlib.util.find_spec("mxnet")
    lib = ctypes.CDLL(str(Path(spec.origin).parent / "libmxnet.so"))
    major, minor, patch = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    lib.zmq_version(ctypes.byref(major), ctypes.byref(minor), ctypes.byref(patch))
    return f"{major.value}.{minor.value}.{patch.value}"


def write_record(path: Path, record: dict) -> None:
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(json.dumps(record, indent=1))
    partial.replace(path)


def array_record(key: int, array) -> dict:
    """What one kvstore call hands over for one key; nbytes is the dense size (row-sparse arrays add
    `rows` and `data_nbytes`)."""
    dtype = numpy.dtype(array.dtype)
    return {"key": int(key), "shape": list(array.shape), "dtype": dtype.name, "stype": array.stype,
            "nbytes": int(numpy.prod(array.shape)) * dtype.itemsize}


class KVStoreRecorder:
    """Wraps a KVStore instance's methods so that every call the Trainer makes is logged, then forwarded."""

    def __init__(self, kvstore, operations: list) -> None:
        self.operations = operations
        for op in ("init", "broadcast", "push", "pull", "pushpull", "row_sparse_pull", "set_optimizer"):
            setattr(kvstore, op, self._wrap(op, getattr(kvstore, op)))

    def _wrap(self, op: str, method):
        def recorded(*args, **kwargs):
            entry = {"op": op, "call_ns": time.time_ns()}
            if op == "set_optimizer":
                optimizer = args[0] if args else kwargs["optimizer"]
                entry["optimizer"] = type(optimizer).__name__.lower()
            else:
                entry["tensors"] = self._tensors(op, args, kwargs)
            result = method(*args, **kwargs)
            entry["return_ns"] = time.time_ns()
            self.operations.append(entry)
            return result

        return recorded

    @staticmethod
    def _tensors(op: str, args: tuple, kwargs: dict) -> list[dict]:
        key = args[0] if args else kwargs["key"]
        # push/init/broadcast/pushpull describe what is sent; pull/row_sparse_pull what is received.
        if op in ("pull", "row_sparse_pull"):
            arrays = kwargs.get("out", args[1] if len(args) > 1 else None)
        else:
            arrays = args[1] if len(args) > 1 else kwargs["value"]
        keys = key if isinstance(key, (list, tuple)) else [key]
        per_key = arrays if isinstance(key, (list, tuple)) else [arrays]
        tensors = []
        for one_key, array in zip(keys, per_key):
            first = array[0] if isinstance(array, (list, tuple)) else array
            entry = array_record(one_key, first)
            if first.stype == "row_sparse" and op in ("push", "init"):
                # Reading the indices waits for the gradient: the call below would wait for it anyway.
                entry["rows"] = int(first.indices.shape[0])
                entry["data_nbytes"] = int(numpy.prod(first.data.shape)) * numpy.dtype(first.dtype).itemsize
            if op == "row_sparse_pull":
                row_ids = kwargs.get("row_ids")
                row_ids = row_ids[0] if isinstance(row_ids, (list, tuple)) else row_ids
                entry["row_ids"] = int(row_ids.size)
                entry["unique_row_ids"] = int(numpy.unique(row_ids.asnumpy()).size)
            tensors.append(entry)
        return tensors


def build_model(name: str, mx, nn):
    """Returns (net, make_batch(rng, batch_size) -> (inputs, labels))."""
    nd = mx.nd
    if name == "mlp":
        # MNIST-shaped synthetic digits: only the central 14x14 pixels are ever lit, as the borders of real
        # MNIST images are blank; the weight gradients of blank pixels are exact zeros on the wire.
        net = nn.Sequential()
        net.add(nn.Dense(32, in_units=784, activation="relu"), nn.Dense(10, in_units=32))
        net.initialize(mx.init.Xavier())

        def make_batch(rng, batch_size):
            images = numpy.zeros((batch_size, 28, 28), dtype="float32")
            images[:, 7:21, 7:21] = rng.random_sample((batch_size, 14, 14))
            return (nd.array(images.reshape(batch_size, 784)),
                    nd.array(rng.randint(0, 10, batch_size), dtype="float32"))

        return net, make_batch
    if name == "wide_mlp":
        # A wide input layer (10000 features, few active per sample, as in a bag-of-words model):
        # 50x the parameters of `mlp`. Its weight starts at zero and only the columns of active features
        # ever change, so the multi-MB tensors on the wire are mostly zeros and the captures gzip well.
        input_units, active_features = 10000, 64
        net = nn.Sequential()
        net.add(nn.Dense(128, in_units=input_units, activation="tanh", weight_initializer=mx.init.Zero()),
                nn.Dense(10, in_units=128))
        net.initialize(mx.init.Xavier())

        def make_batch(rng, batch_size):
            features = rng.random_sample((batch_size, input_units)).astype("float32")
            features[:, active_features:] = 0.0
            features[features < 0.8] = 0.0
            return nd.array(features), nd.array(rng.randint(0, 10, batch_size), dtype="float32")

        return net, make_batch
    if name == "lenet":
        # LeNet-5 as MXNet's MNIST example builds it (1.7 MB of parameters): a job whose batches compute
        # for several milliseconds per worker between two exchanges, as real training does, rather than
        # the communication-bound `mlp`.
        net = nn.Sequential()
        net.add(nn.Conv2D(20, kernel_size=5, in_channels=1, activation="relu"), nn.MaxPool2D(2, 2),
                nn.Conv2D(50, kernel_size=5, in_channels=20, activation="relu"), nn.MaxPool2D(2, 2),
                nn.Flatten(), nn.Dense(500, in_units=800, activation="relu"), nn.Dense(10, in_units=500))
        net.initialize(mx.init.Xavier())

        def make_batch(rng, batch_size):
            images = numpy.zeros((batch_size, 1, 28, 28), dtype="float32")
            images[:, :, 4:24, 4:24] = rng.random_sample((batch_size, 1, 20, 20))
            return nd.array(images), nd.array(rng.randint(0, 10, batch_size), dtype="float32")

        return net, make_batch
    if name == "sparse_embedding":
        return build_sparse_embedding(mx, nn)
    raise SystemExit(f"unknown model {name!r}")


def build_sparse_embedding(mx, nn):
    """An embedding with sparse_grad=True over token ids, then a dense classifier.

    Gluon's SparseEmbedding (row-sparse weight, sparse_grad=True) makes the Trainer push row-sparse
    gradients and row_sparse_pull the rows a batch uses. (nn.Embedding(sparse_grad=True) keeps a dense
    weight and MXNet 1.9.1's dist server aborts on its first row-sparse push: "copying size mismatch".)
    """
    from mxnet.gluon.contrib.nn import SparseEmbedding

    vocabulary, embedding_dim, tokens = 5000, 16, 6

    class BagOfEmbeddings(mx.gluon.Block):
        def __init__(self):
            super().__init__()
            with self.name_scope():
                self.embedding = SparseEmbedding(vocabulary, embedding_dim)
                self.classifier = nn.Dense(2, in_units=embedding_dim)

        def forward(self, token_ids):
            return self.classifier(self.embedding(token_ids).mean(axis=1))

    net = BagOfEmbeddings()
    net.initialize(mx.init.Normal(0.01))

    def make_batch(rng, batch_size):
        # Zipf-like ids: a few rows are hit by every batch, most rows never.
        token_ids = mx.nd.array(rng.zipf(1.3, (batch_size, tokens)) % vocabulary)
        return token_ids, mx.nd.array(rng.randint(0, 2, batch_size))

    return net, make_batch


def run_worker(args, record: dict) -> None:
    import mxnet as mx
    from mxnet import autograd, gluon
    from mxnet.gluon import nn

    kvstore = mx.kv.create(args.kvstore)
    operations: list = []
    KVStoreRecorder(kvstore, operations)
    rng = numpy.random.RandomState(args.seed + kvstore.rank)
    mx.random.seed(args.seed)
    net, make_batch = build_model(args.model, mx, nn)
    params = net.collect_params()
    # The gradient scale goes with the optimizer to the servers; with a row-sparse weight the kvstore (and
    # so the optimizer) is set up by the first forward pass, before step() could pass a batch size.
    if args.optimizer == "stallingsgd":
        import stalling_sgd  # noqa: F401  (registers the optimizer; the servers unpickle it from there)
    trainer = gluon.Trainer(params, args.optimizer, {"learning_rate": args.learning_rate,
                                            "rescale_grad": 1.0 / args.batch_size}, kvstore=kvstore)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    record.update(
        rank=kvstore.rank,
        num_workers=kvstore.num_workers,
        kvstore=kvstore.type,
        model=args.model,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        parameters=sorted(
            ({"key": trainer._param2idx[name], "name": name, "shape": list(param.shape),
              "dtype": numpy.dtype(param.dtype).name, "stype": param._stype, "grad_stype": param._grad_stype,
              "nbytes": int(numpy.prod(param.shape)) * numpy.dtype(param.dtype).itemsize}
             for name, param in params.items()),
            key=lambda parameter: parameter["key"],
        ),
        operations=operations,
        batches=[],
    )
    for index in range(args.batches):
        inputs, labels = make_batch(rng, args.batch_size)
        start_ns = time.time_ns()
        with autograd.record():
            loss = loss_fn(net(inputs), labels)
        loss.backward()
        if index == args.stall_batch:
            record["fault"] = {"kind": "stall", "batch": index, "stall_s": args.stall_s, "start_ns": time.time_ns()}
            write_record(args.record, record)        # the recorder may give up on the job while it sleeps
            mx.nd.waitall()
            time.sleep(args.stall_s)
            record["fault"]["end_ns"] = time.time_ns()
        trainer.step(1)
        mean_loss = float(loss.mean().asscalar())
        record["batches"].append({"index": index, "start_ns": start_ns, "end_ns": time.time_ns(), "loss": mean_loss})
    mx.nd.waitall()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", type=Path, required=True, help="where to write this node's JSON record")
    parser.add_argument("--model", default="mlp", choices=["mlp", "wide_mlp", "lenet", "sparse_embedding"])
    parser.add_argument("--kvstore", default="dist_sync")
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--optimizer", default="sgd", choices=["sgd", "stallingsgd"])
    parser.add_argument("--stall-batch", type=int, default=None,
                        help="worker: sleep before this batch's trainer.step; server: in this iteration's update")
    parser.add_argument("--stall-s", type=float, default=1.0, help="seconds of that sleep")
    args = parser.parse_args()

    role = os.environ["DMLC_ROLE"]
    record = {
        "role": role,
        "pid": os.getpid(),
        "host": os.environ.get("DMLC_NODE_HOST"),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(DMLC_ENV_PREFIXES)},
        "versions": {"mxnet": importlib.metadata.version("mxnet"), "libzmq": libzmq_version_inside_mxnet()},
        "start_ns": time.time_ns(),
        "finished": False,
    }
    try:
        if role == "worker":
            run_worker(args, record)
        else:
            # Scheduler and server: importing mxnet runs the ps-lite loop, then calls sys.exit(). The failed
            # import leaves mxnet out of sys.modules: importing it again would start a second ps-lite node.
            if role == "server" and args.stall_batch is not None:
                os.environ[STALL_ENV] = f"{args.stall_batch}:{args.stall_s}"
            try:
                import mxnet  # noqa: F401
            except SystemExit:
                pass
            stalled = getattr(sys.modules.get("stalling_sgd"), "FAULTS", None)
            if stalled:
                record["fault"] = stalled[0]
        record["finished"] = True
    finally:
        record["end_ns"] = time.time_ns()
        write_record(args.record, record)
        sys.stderr.flush()


if __name__ == "__main__":
    main()
