"""Run the project's real code on `device="cuda"` without a GPU, and catch what would break or stall a GPU.

`fake_cuda()` makes every tensor created on or moved to `cuda` a FakeTensor (torch._subclasses.fake_tensor):
shape, dtype and device without data. The code then runs as on a GPU, except that
- mixing a CUDA tensor with a CPU tensor raises (FakeTensorDeviceMismatchError), and so does an op that
  writes a CPU tensor while reading a CUDA one (TensorIterator's rule, stricter than the fake mode's own check);
- every host synchronisation is recorded as an `Event` with the Python call stack it came from: a host read
  (`.item()`, `.tolist()`, `bool()`, `float()`, `.numpy()`), a device-to-host copy, a host-to-device copy that
  is blocking or not from page-locked memory, `torch.cuda.synchronize`. A read or copy back returns real
  zeros of the right shape (a fill value for reads), so the program goes on past it. Host-to-device copies the
  host waits for are flagged wherever they hide: `.to(cuda)` / `.cuda()` / `copy_` of pageable memory or with
  non_blocking=False, a tensor built on the GPU from Python or NumPy data (`torch.tensor(data, device=cuda)`,
  `torch.as_tensor`, `torch.asarray`, `cuda_tensor.new_tensor(data)`), and a CUDA tensor indexed with a Python
  list or a CPU index tensor (torch copies the index up from pageable memory first) or assigned a CPU tensor;
- every copy that does not make the host wait (pinned, non_blocking=True) is counted in `Ledger.uploads`, so a
  test can bound the uploads per batch;

What fake tensors cannot do is stood in for (each patch is undone on exit): `torch.cuda` queries answer one
GPU with bf16; autocast("cuda") is allowed (torch disables it where no CUDA driver is found); CUDA streams and
events are no-ops; `pin_memory()` marks a CPU copy as page-locked; `torch.save` writes zeros for CUDA tensors
(recorded as a device-to-host copy); the autograd engine, which needs a CUDA context for CUDA tensors (pytorch
issue 92627), is replaced by `python_backward`, which walks the graph and calls each backward node.

Out of reach: numerics (no data), speed, torch.compile, CUDA graphs, NCCL, DataLoader worker processes,
tensor hooks on gradients. docs/gpu.md says what this layer proves.
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from unittest import mock

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.overrides import TorchFunctionMode

READ_FILL = 0  # what a host read of a fake value returns: the project keeps "nothing went wrong" as zeros

FACTORIES = {torch.empty, torch.zeros, torch.ones, torch.full, torch.rand, torch.randn, torch.randint,
             torch.randperm, torch.arange, torch.linspace, torch.tensor, torch.as_tensor, torch.asarray, torch.eye,
             torch.empty_strided, torch.zeros_like, torch.ones_like, torch.full_like, torch.empty_like,
             torch.rand_like, torch.randn_like, torch.scalar_tensor}
FROM_HOST_DATA = (torch.tensor, torch.as_tensor, torch.asarray)  # their data argument is host data
INDEXING = {torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.Tensor.index_put_, torch.Tensor.index_put}
# tolist is FakeTensor's own method (patched in fake_cuda), not routed through __torch_function__
READS = {torch.Tensor.item: "item", torch.Tensor.__bool__: "bool",
         torch.Tensor.__float__: "float", torch.Tensor.__int__: "int", torch.Tensor.__index__: "index",
         torch.Tensor.numpy: "numpy"}


class NoDeviceFakeMode(FakeTensorMode):
    """FakeTensorMode that never initialises a CUDA device: it asks torch.cuda.is_available(), which the
    layer answers True, and would then call into the (absent) driver."""

    avoid_device_init = True


class HostWriteFromDevice(RuntimeError):
    """An op would write a CPU tensor from a CUDA one: a real GPU raises 'Expected all tensors to be on the
    same device'."""


@dataclass
class Event:
    kind: str  # read | device-to-host | blocking-host-to-device | unpinned-host-to-device | synchronize
    what: str
    stack: tuple[str, ...]  # "module:qualified name" of the Python frames, innermost first

    def site(self) -> str:
        """The innermost frame of the project's code: where the host wait is written."""
        return next((s for s in self.stack if s.startswith("resmlp")), self.stack[0])

    def within(self, *names: str) -> bool:
        """True when a frame's qualified name (`Class.method` or `function`) is one of `names`."""
        return any(frame.split(":", 1)[1] in names for frame in self.stack)


BLOCKING_UPLOADS = ("blocking-host-to-device", "unpinned-host-to-device")  # host-to-device copies the host waits for


@dataclass
class Ledger:
    events: list[Event] = field(default_factory=list)  # host waits
    uploads: list[Event] = field(default_factory=list)  # pinned non-blocking host-to-device copies: no wait

    def record(self, kind: str, what: str) -> None:
        frames, frame = [], sys._getframe(2)
        while frame is not None:
            frames.append(f"{frame.f_globals.get('__name__', '?')}:{frame.f_code.co_qualname}")
            frame = frame.f_back
        (self.uploads if kind == "upload" else self.events).append(Event(kind, what, tuple(frames)))

    def clear(self) -> None:
        self.events.clear()
        self.uploads.clear()

    def blocking_uploads(self) -> list[Event]:
        """Host-to-device copies the host waits for (from pageable memory or with non_blocking=False)."""
        return [e for e in self.events if e.kind in BLOCKING_UPLOADS]

    def inside(self, *names: str, allowed: tuple[str, ...] = ()) -> list[Event]:
        """Events with one of `names` on their stack and none of `allowed`."""
        return [e for e in self.events if e.within(*names) and not e.within(*allowed)]

    def per_site(self, events: list[Event] | None = None) -> Counter:
        return Counter(f"{e.kind} at {e.site()}" for e in (self.events if events is None else events))


def is_fake_cuda(value: object) -> bool:
    return isinstance(value, FakeTensor) and value.device.type == "cuda"


def _is_cuda(device: object) -> bool:
    if device is None:
        return False
    if isinstance(device, int):
        return True
    return torch.device(device).type == "cuda"


def _target_device(args: tuple, kwargs: dict) -> torch.device | None:
    """The device of a Tensor.to(...) call, if it names one."""
    if "device" in kwargs and kwargs["device"] is not None:
        return torch.device(kwargs["device"])
    for arg in args[1:]:
        if isinstance(arg, (str, torch.device)):
            return torch.device(arg)
        if isinstance(arg, torch.Tensor):
            return arg.device
    return None


def _tensors_in(value: object) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors_in(item)


def _real_zeros(tensor: torch.Tensor) -> torch.Tensor:
    return torch.zeros(tensor.shape, dtype=tensor.dtype)


class FakeCudaRouter(TorchFunctionMode):
    """Routes CUDA tensor creation and host transfers; records host synchronisations."""

    def __init__(self, mode: FakeTensorMode, ledger: Ledger) -> None:
        super().__init__()
        self.mode, self.ledger = mode, ledger

    def to_fake_cuda(self, tensor: torch.Tensor, device: torch.device, non_blocking: bool) -> torch.Tensor:
        if not getattr(tensor, "_fake_pinned", False):
            self.ledger.record("unpinned-host-to-device", f"copy of {tuple(tensor.shape)} from pageable memory")
        elif not non_blocking:
            self.ledger.record("blocking-host-to-device", f"blocking copy of {tuple(tensor.shape)}")
        else:
            self.ledger.record("upload", f"pinned non-blocking copy of {tuple(tensor.shape)}")
        with self.mode:
            fake = self.mode.from_tensor(tensor.detach())
            moved = fake.to(device if device.index is not None else torch.device("cuda", 0))
        return moved.requires_grad_(tensor.requires_grad) if tensor.is_leaf and tensor.requires_grad else moved

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and _is_cuda(kwargs.get("device")):
            if func in FROM_HOST_DATA and not (args and is_fake_cuda(args[0])):  # a copy from pageable memory
                self.ledger.record("unpinned-host-to-device", f"{func.__name__}(...) on the GPU")
            with self.mode:
                return func(*args, **kwargs)
        if func is torch.Tensor.new_tensor and args and is_fake_cuda(args[0]) and not (
                len(args) > 1 and is_fake_cuda(args[1])) and _is_cuda(kwargs.get("device", args[0].device)):
            self.ledger.record("unpinned-host-to-device", f"new_tensor(...) of a {tuple(args[0].shape)} GPU tensor")
        if func in INDEXING and args and is_fake_cuda(args[0]):
            self._check_index_upload(func, args)
        if func in READS and args and is_fake_cuda(args[0]):
            self.ledger.record("read", f"{READS[func]}() of {tuple(args[0].shape)}")
            if func is torch.Tensor.numpy:
                return _real_zeros(args[0]).numpy()
            return {"bool": False, "float": float(READ_FILL)}.get(READS[func], READ_FILL)
        if func in (torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu) and args:
            moved = self._move(func, args, kwargs)
            if moved is not None:
                return moved
        if func is torch.Tensor.copy_ and len(args) >= 2:
            dst, src = args[0], args[1]
            if is_fake_cuda(src) and not is_fake_cuda(dst):
                self.ledger.record("device-to-host", f"copy_ of {tuple(src.shape)} into a CPU tensor")
                return dst.zero_()
            if is_fake_cuda(dst) and isinstance(src, torch.Tensor) and not isinstance(src, FakeTensor):
                fake_src = self.to_fake_cuda(src, dst.device, kwargs.get("non_blocking", False))
                return func(dst, fake_src)
        self._check_host_write(func, args, kwargs)
        if any(isinstance(t, FakeTensor) for t in _tensors_in((args, kwargs))):
            with self.mode:  # python scalars become tensors without asking the (absent) driver
                return func(*args, **kwargs)
        return func(*args, **kwargs)

    def _move(self, func, args: tuple, kwargs: dict) -> torch.Tensor | None:
        tensor = args[0]
        if func is torch.Tensor.cuda:
            device = torch.device("cuda", args[1] if len(args) > 1 and isinstance(args[1], int) else 0)
        elif func is torch.Tensor.cpu:
            device = torch.device("cpu")
        else:
            device = _target_device(args, kwargs)
        if device is None:
            return None
        if device.type == "cuda" and not isinstance(tensor, FakeTensor):
            moved = self.to_fake_cuda(tensor, device, kwargs.get("non_blocking", False))
            rest = {k: v for k, v in kwargs.items() if k in ("dtype", "memory_format")}
            dtype = next((a for a in args[1:] if isinstance(a, torch.dtype)), None)
            if dtype is not None:
                rest["dtype"] = dtype
            return moved.to(**rest) if rest else moved
        if device.type == "cuda" and is_fake_cuda(tensor):  # already there: dtype or layout only
            with self.mode:  # (outside the mode, torch would initialise the absent driver for the device)
                return func(*args, **kwargs)
        if device.type == "cpu" and is_fake_cuda(tensor):
            self.ledger.record("device-to-host", f"{func.__name__} of {tuple(tensor.shape)} to the CPU")
            dtype = kwargs.get("dtype") or next((a for a in args[1:] if isinstance(a, torch.dtype)), tensor.dtype)
            return torch.zeros(tensor.shape, dtype=dtype)
        return None

    def _check_index_upload(self, func, args: tuple) -> None:
        """A CUDA tensor indexed with a list or a CPU index tensor (torch copies it up from pageable memory
        before the kernel), or assigned a CPU tensor of more than one value (copied up the same way)."""
        index = args[1] if len(args) > 1 else ()
        if func in (torch.Tensor.index_put_, torch.Tensor.index_put):  # indices: a sequence of tensors
            index = tuple(index)
        for part in index if isinstance(index, tuple) else (index,):
            host_list = isinstance(part, list) and not all(is_fake_cuda(p) for p in part)
            if host_list or (isinstance(part, torch.Tensor) and not isinstance(part, FakeTensor) and part.dim() > 0):
                self.ledger.record("unpinned-host-to-device", f"{func.__name__} with a host index")
                return
        value = args[2] if len(args) > 2 else None
        if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor) and value.numel() > 1:
            self.ledger.record("unpinned-host-to-device", f"{func.__name__} of a CPU tensor {tuple(value.shape)}")

    def _check_host_write(self, func, args: tuple, kwargs: dict) -> None:
        """TensorIterator refuses to write a CPU tensor (in place or out=) while reading a CUDA one."""
        name = getattr(func, "__name__", "")
        targets = list(_tensors_in(kwargs.get("out")))
        if name.endswith("_") and not name.startswith("__") or name.startswith("__i"):
            targets += [args[0]] if args and isinstance(args[0], torch.Tensor) else []
        host_targets = [t for t in targets if not is_fake_cuda(t)]
        if host_targets and any(is_fake_cuda(t) for t in _tensors_in((args, kwargs))):
            raise HostWriteFromDevice(f"{name} would write a CPU tensor {tuple(host_targets[0].shape)} from a CUDA "
                                      "tensor: 'Expected all tensors to be on the same device' on a GPU")


# ------------------------------------------------------------------------------------------ autograd
def python_backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None,
                    **_unused) -> None:
    """torch.autograd.backward without the C++ engine: a topological walk over grad_fn nodes, calling each
    (the engine sets up CUDA devices, which fake tensors do not have). Gradients accumulate into `.grad`."""
    roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
    if grad_tensors is None:
        grad_tensors = [None] * len(roots)
    elif isinstance(grad_tensors, torch.Tensor):
        grad_tensors = [grad_tensors]
    pending: dict[object, list] = {}
    order: list[object] = []
    seen: set[object] = set()
    for root, grad in zip(roots, grad_tensors, strict=True):
        grad = torch.ones_like(root) if grad is None else grad
        if root.grad_fn is None:
            _accumulate(root, grad)
            continue
        _add(pending, root.grad_fn, root.output_nr, grad)
        _postorder(root.grad_fn, seen, order)
    for node in reversed(order):
        grads = pending.pop(node, None)
        if grads is None:
            continue
        if hasattr(node, "variable"):  # AccumulateGrad: the leaf
            _accumulate(node.variable, grads[0])
            continue
        grads = grads + [None] * (len(node._input_metadata) - len(grads))
        if callable(node):  # a C++ node
            outputs = node(*grads)
        else:  # a torch.autograd.Function's node: its backward gets zeros for unused outputs (materialize_grads)
            outputs = node.apply(*(g if g is not None else torch.zeros(m.shape, dtype=m.dtype, device=m.device)
                                   for g, m in zip(grads, node._input_metadata, strict=True)))
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        for (child, index), grad in zip(node.next_functions, outputs, strict=False):
            if child is not None and grad is not None:
                _add(pending, child, index, _validated(child, index, grad))


def _validated(node, index: int, grad: torch.Tensor) -> torch.Tensor:
    """What the engine does between nodes: sum a broadcast gradient back to the input's shape and cast it to
    the input's dtype (autocast's casts are undone this way)."""
    if hasattr(node, "variable"):
        shape, dtype = node.variable.shape, node.variable.dtype
    else:
        meta = node._input_metadata[index]
        shape, dtype = meta.shape, meta.dtype
    if tuple(grad.shape) != tuple(shape):
        grad = grad.sum_to_size(shape)
    return grad.to(dtype) if grad.dtype != dtype else grad


def _postorder(start, seen: set, order: list) -> None:
    stack = [(start, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if node in seen:
            continue
        seen.add(node)
        stack.append((node, True))
        stack.extend((child, False) for child, _ in node.next_functions if child is not None and child not in seen)


def _add(pending: dict, node, index: int, grad: torch.Tensor) -> None:
    slots = pending.setdefault(node, [])
    slots.extend([None] * (index + 1 - len(slots)))
    slots[index] = grad if slots[index] is None else slots[index] + grad


def _accumulate(leaf: torch.Tensor, grad: torch.Tensor) -> None:
    grad = grad.detach()
    leaf.grad = grad if leaf.grad is None else leaf.grad + grad


# ------------------------------------------------------------------------------------------ stand-ins
class _Stream:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def wait_stream(self, other) -> None:
        pass

    def is_capturing(self) -> bool:
        return False

    def synchronize(self) -> None:
        pass

    def record_event(self, event=None):
        return event or _Event()


class _Event:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def record(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other) -> float:
        return 0.0


class _CpuGenerator(torch.Generator):
    """torch.Generator(device="cuda") would need the driver: a CPU generator stands in (fake tensors draw no
    numbers, so its state is never used on a fake CUDA tensor)."""

    def __new__(cls, device: object = "cpu"):
        return super().__new__(cls, "cpu")


def _fake_save(ledger: Ledger, real_save):
    def save(obj, *args, **kwargs):
        if any(is_fake_cuda(t) for t in _tensors_in(obj)):
            ledger.record("device-to-host", "torch.save of CUDA tensors")
        return real_save(_to_real(obj), *args, **kwargs)

    return save


def _to_real(value: object) -> object:
    if is_fake_cuda(value):
        return _real_zeros(value)
    if isinstance(value, dict):
        return type(value)((k, _to_real(v)) for k, v in value.items()) if type(value) is not dict else \
            {k: _to_real(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_to_real(v) for v in value)
    return value


@contextlib.contextmanager
def fake_cuda() -> Iterator[Ledger]:
    """Inside: `cuda` tensors are fake and host synchronisations go to the yielded Ledger."""
    mode, ledger = NoDeviceFakeMode(allow_non_fake_inputs=True), Ledger()
    real_save, real_swap = torch.save, torch.utils.swap_tensors

    def pin_memory(self, *args, **kwargs):
        pinned = self.clone()
        pinned._fake_pinned = True
        return pinned

    def tolist(self):  # FakeTensor's own tolist reads element by element: one read, as on a GPU
        ledger.record("read", f"tolist() of {tuple(self.shape)}")
        return torch.full(self.shape, READ_FILL).to(torch.bool if self.dtype == torch.bool else
                                                    torch.float64).tolist()

    def swap_tensors(t1, t2) -> None:
        """Module._apply swaps fake parameters; one the fake mode has seen (a weak reference) cannot be
        swapped, so its data is replaced instead, what Module._apply does for real tensors."""
        try:
            real_swap(t1, t2)
        except RuntimeError:
            if not (isinstance(t1, FakeTensor) and isinstance(t2, FakeTensor)):
                raise
            t1.data = t2.detach()

    def deepcopy(self, memo):
        """A fake tensor copied as a fake tensor (torch's own copies its meta storage by pointer, which
        corrupts the heap at exit)."""
        if id(self) not in memo:
            with mode:
                copy = self.detach().clone().requires_grad_(self.requires_grad)
            if getattr(self, "_is_param", False):
                copy._is_param = True
            memo[id(self)] = copy
        return memo[id(self)]

    def backward(*args, **kwargs) -> None:
        with mode:  # backward nodes that create tensors (zeros for a scalar's gradient) create fake ones
            python_backward(*args, **kwargs)

    def synchronize(*args, **kwargs) -> None:
        ledger.record("synchronize", "torch.cuda.synchronize")

    patches = [
        mock.patch("torch.cuda.is_available", lambda: True),
        mock.patch("torch.cuda.device_count", lambda: 1),
        mock.patch("torch.cuda.current_device", lambda: 0),
        mock.patch("torch.cuda.set_device", lambda device: None),
        mock.patch("torch.cuda.get_device_name", lambda *a: "fake CUDA (tests/fakecuda.py)"),
        mock.patch("torch.cuda.is_bf16_supported", lambda *a, **k: True),
        mock.patch("torch.cuda.get_device_properties",
                   lambda *a: SimpleNamespace(name="fake CUDA", total_memory=80 * 2**30, major=9, minor=0,
                                              multi_processor_count=132)),
        mock.patch("torch.cuda.synchronize", synchronize),
        mock.patch("torch.cuda.Stream", _Stream),
        mock.patch("torch.cuda.Event", _Event),
        mock.patch("torch.cuda.stream", lambda stream=None: contextlib.nullcontext()),
        mock.patch("torch.cuda.current_stream", lambda device=None: _Stream()),
        mock.patch("torch.accelerator.current_stream", lambda device=None: _Stream()),
        mock.patch("torch.cuda.is_current_stream_capturing", lambda: False),
        mock.patch("torch.cuda.get_rng_state", lambda device=None: torch.zeros(16, dtype=torch.uint8)),
        mock.patch("torch.cuda.set_rng_state", lambda state, device=None: None),
        mock.patch("torch.cuda.amp.common.amp_definitely_not_available", lambda: False),
        mock.patch("torch.Tensor.pin_memory", pin_memory),
        mock.patch("torch.Tensor.is_pinned", lambda self, *a: bool(getattr(self, "_fake_pinned", False))),
        mock.patch("torch.Tensor.record_stream", lambda self, stream: None),
        mock.patch("torch.Tensor.backward",
                   lambda self, gradient=None, retain_graph=None, create_graph=False, inputs=None:
                   backward(self, gradient, retain_graph, create_graph, inputs)),
        mock.patch("torch.autograd.backward", backward),
        mock.patch("torch.save", _fake_save(ledger, real_save)),
        mock.patch.object(FakeTensor, "tolist", tolist),
        mock.patch("torch.Generator", _CpuGenerator),
        mock.patch.object(FakeTensor, "__deepcopy__", deepcopy, create=True),
        mock.patch("torch.utils.swap_tensors", swap_tensors),
    ]
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        stack.enter_context(FakeCudaRouter(mode, ledger))
        yield ledger
