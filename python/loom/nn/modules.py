"""The built-in modules: loom.nn.Linear, LayerNorm, Embedding, Dropout, MLP,
CausalSelfAttention, Block, GPT, EmbeddingBagCollection.

Each is a loom.nn.Module whose parameters and forward live in C++ (core/nn, bound in
python/src/nn.cpp): ``named_parameters()`` and ``state_dict()`` report the C++ names
(``blocks.0.attn.qkv.weight``), children are reachable as attributes (``gpt.blocks[0].attn``), and
a built-in module can be a child of a Python module. See Note [Built-in modules from Python].

Initialisation: a built-in module's weights are filled at construction by
``init_parameters(seed=0)`` under its own names. Call ``init_parameters(seed)`` on the root model
to re-key every built-in parameter by its full name (as loom's C++ models do), so the values do
not depend on how the model was assembled.

Where a built-in module differs from a Python one (the C++ module owns its tensors):

- ``lin.weight = loom.nn.Parameter(t)`` copies t's values (and its requires_grad) into the
  module's own weight, whose shape cannot change. ``wte.weight = lm_head.weight`` (another
  module's parameter: a leaf that requires grad) ties them as in PyTorch: both modules use that
  one tensor (same shape, dtype and device; Linear, Embedding and LayerNorm parameters), and
  ``named_parameters()`` lists it once. Freeze with ``lin.weight.requires_grad_(False)`` or
  ``lin.requires_grad_(False)``.
- ``copy.deepcopy`` builds a new module from the constructor's arguments and copies the values,
  dtype, device, names and modes; a view of a C++ child (``gpt.blocks[0]``) and the modules over
  process groups (tensor-parallel, pipeline stages, sharded tables) cannot be copied.
"""

import collections
import copy

from loom import _loom
from loom.autograd import no_grad
from loom.nn.module import Module, Parameter, _copy_tensor

_cpp = _loom.nn


class _CppModule(Module):
    """A loom.nn.Module over a C++ module (``self._cpp``)."""

    # True for the single-process modules, which copy.deepcopy rebuilds from their arguments.
    _copy_by_rebuild = False

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls)
        self.__dict__["_ctor_args"] = (args, kwargs)  # for copy.deepcopy
        return self

    def __init__(self, cpp, init_seed=0):
        super().__init__()
        object.__setattr__(self, "_cpp", cpp)
        object.__setattr__(self, "_views", {})
        if init_seed is not None:
            cpp.init_parameters(init_seed)

    @classmethod
    def _from_cpp(cls, cpp):
        """A wrapper of an existing C++ module (a child), without initialising it."""
        wrapper_type = _WRAPPERS.get(type(cpp), _CppModule)
        self = wrapper_type.__new__(wrapper_type)
        _CppModule.__init__(self, cpp, init_seed=None)
        object.__setattr__(self, "_is_view", True)
        return self

    # ---- attributes: C++ children and own parameters by name ----
    def __getattr__(self, name):
        d = self.__dict__
        if "_cpp" not in d:
            raise AttributeError(name)
        views = d["_views"]
        if name in views:
            return views[name]
        for child_name, child in d["_cpp"].children():
            if child_name == name:
                views[name] = _CppModule._from_cpp(child)
                return views[name]
        for param_name, p in d["_cpp"].named_parameters():
            if param_name == name:
                return p
        return Module.__getattr__(self, name)

    def __getitem__(self, i):  # a ModuleList's children, "0", "1", ...
        children = self._cpp.children()
        return getattr(self, children[i][0])

    def __len__(self):
        return len(self._cpp.children())

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __setattr__(self, name, value):
        cpp = self.__dict__.get("_cpp")
        own = dict(cpp.named_parameters()) if cpp is not None and "." not in name else {}
        if name in own and name not in self.__dict__.get("_buffers", {}):
            self._assign_parameter(name, own[name], value)
        else:
            Module.__setattr__(self, name, value)

    def _assign_parameter(self, name, current, value):
        """``module.<name> = Parameter(t)`` for a C++ parameter: t's values (converted to the
        parameter's dtype and device) and requires_grad, copied in. See the file's docstring."""
        owner = f"{type(self).__name__}.{name}"
        if (isinstance(value, _loom.Tensor) and value.data_ptr() == current.data_ptr()
                and tuple(value.shape) == tuple(current.shape) and value.dtype == current.dtype):
            return  # the parameter itself, as `module.weight += x` assigns back: nothing to do
        if (isinstance(value, _loom.Tensor) and not isinstance(value, Parameter)
                and value.is_leaf and value.requires_grad):
            # Weight tying, PyTorch's `wte.weight = lm_head.weight`: the module now uses that
            # very tensor (C++ Module::tie_parameter; shape, dtype and device must match).
            self._cpp._tie_parameter(name, value)
            return
        if not isinstance(value, Parameter):
            raise TypeError(
                f"cannot assign a {type(value).__name__} to {owner}: a built-in module's "
                f"parameter takes another parameter (a leaf that requires grad: the two are then "
                f"one tensor, tied) or a loom.nn.Parameter (its values are copied in); to set "
                f"values in place use `with loom.no_grad(): module.{name}.copy_(t)`")
        if tuple(value.shape) != tuple(current.shape):
            raise ValueError(f"cannot assign a parameter of shape {list(value.shape)} to {owner} "
                             f"of shape {list(current.shape)}: a built-in module's parameters "
                             f"keep their shapes (build a module of the new size)")
        with no_grad():
            current.copy_(value.detach().to(dtype=current.dtype, device=current.device))
        current.requires_grad_(value.requires_grad)

    # ---- the Module interface, answered by C++ ----
    def forward(self, x):
        return self._cpp(x)

    def __call__(self, *args, **kwargs):  # C++ runs this module's hooks (Module::operator())
        return self.forward(*args, **kwargs)

    def _cpp_module(self):
        return self._cpp

    def _own_parameters(self):
        return [(n, p) for n, p in self._cpp.named_parameters() if "." not in n]

    def named_children(self):
        return iter([(name, getattr(self, name)) for name, _ in self._cpp.children()])

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True, _seen=None):
        # C++ lists a tensor tied inside this subtree once; _seen carries the ones a Python
        # parent has listed already (See Module.named_parameters).
        params = self._cpp.named_parameters() if recurse else self._own_parameters()
        seen = set() if _seen is None else _seen
        for name, p in params:
            if remove_duplicate:
                if p._identity() in seen:
                    continue
                seen.add(p._identity())
            yield (prefix + "." + name if prefix else name), p

    def state_dict(self, destination=None, prefix="", keep_vars=False):
        # The C++ order (parameters and children interleaved as registered), then the buffers
        # registered from Python on this module or its views.
        out = collections.OrderedDict() if destination is None else destination
        entries = list(self._cpp.named_parameters()) + list(
            self.named_buffers(_persistent_only=True))
        for name, t in entries:
            out[prefix + name] = t if keep_vars else t.detach()
        return out

    def num_parameters(self):
        return self._cpp.num_parameters()

    @property
    def training(self):
        return self._cpp.training

    @training.setter
    def training(self, mode):
        self._cpp.train(bool(mode))

    def train(self, mode=True):
        self._cpp.train(bool(mode))
        return self

    def zero_grad(self, set_to_none=True):
        if set_to_none:
            self._cpp.zero_grad()
        else:
            Module.zero_grad(self, set_to_none=False)

    def _to(self, dtype, device):
        # C++ Module::to: the same tensors converted in place, with each module's own follow-up
        # (EmbeddingBagCollection regroups its tables).
        if device is not None:
            self._cpp.to_device(device)
        if dtype is not None:
            self._cpp.to_dtype(dtype)
        for m in self.modules():
            m._buffers_to(dtype, device)

    def __deepcopy__(self, memo):
        name = type(self).__name__
        if self.__dict__.get("_is_view", False):
            raise TypeError(
                f"copy.deepcopy: this {name} is a child of a built-in module (such as "
                f"gpt.blocks[0]), whose C++ module cannot be copied alone; deepcopy the whole "
                f"model, or build a new {name} and load_state_dict(child.state_dict())")
        if not type(self)._copy_by_rebuild:
            raise TypeError(
                f"copy.deepcopy: {name} is not copyable (its C++ module holds a process group, "
                f"pipeline stages or shards); build another with the same arguments and "
                f"load_state_dict(original.state_dict())")
        mods = list(self.modules())
        if any(m._cpp.has_forward_hooks for m in mods if isinstance(m, _CppModule)):
            raise RuntimeError(
                f"copy.deepcopy: {name} is wrapped by ZeroRedundancyOptimizer stage 3, so it "
                f"holds only this rank's shard; deepcopy the model before wrapping it")
        args, kwargs = self.__dict__["_ctor_args"]
        new = type(self)(*args, **kwargs)
        memo[id(self)] = new
        params = self._cpp.named_parameters()
        if params:  # the built-in .to() converts every parameter alike
            first = params[0][1]
            new._cpp.to_device(first.device)
            new._cpp.to_dtype(first.dtype)
        with no_grad():
            for (_, p), (_, q) in zip(params, new._cpp.named_parameters()):
                q.copy_(p.detach().to(dtype=q.dtype))
                q.requires_grad_(p.requires_grad)
        new._cpp.full_name = self._cpp.full_name
        internal = {"_cpp", "_views", "_ctor_args", "_parameters", "_modules", "_buffers",
                    "_non_persistent_buffers", "_training", "_is_view", "_node"}
        for a, b in zip(mods, new.modules()):  # pre-order: a parent's train() comes first
            b._cpp.train(a.training)
            b.__dict__["_buffers"] = collections.OrderedDict(
                (n, None if t is None else _copy_tensor(t, memo))
                for n, t in a.__dict__["_buffers"].items())
            b.__dict__["_non_persistent_buffers"] = set(a.__dict__["_non_persistent_buffers"])
            for key, value in a.__dict__.items():
                if key not in internal:
                    b.__dict__[key] = copy.deepcopy(value, memo)
        return new

    def init_parameters(self, seed, _prefix=""):
        """Fills this module's parameters under ``seed``, keyed by their full names (this
        module's name from the root it was called from, then the C++ names below it). A view of
        a C++ module's child (gpt.blocks[0]) keeps the name it has in its C++ parent."""
        if not self.__dict__.get("_is_view", False):
            self._cpp.full_name = _prefix
        self._cpp.init_parameters(seed)
        return self


class Linear(_CppModule):
    """y = x W^T + b, W [out_features, in_features] (torch.nn.Linear's layout).

    Example::

        >>> lin = loom.nn.Linear(4, 3)
        >>> [name for name, _ in lin.named_parameters()]
        ['weight', 'bias']
        >>> lin(loom.ones(2, 4)).shape
        (2, 3)

    Init (GPT-2's): weight normal(0, init_std), bias 0.
    """

    _copy_by_rebuild = True

    def __init__(self, in_features, out_features, bias=True, *, init_std=0.02):
        super().__init__(_cpp.Linear(in_features, out_features, bias, init_std))

    @property
    def weight(self):
        return self._cpp.weight

    @property
    def bias(self):  # None without a bias
        return self._cpp.bias

    def extra_repr(self):
        return (f"in_features={self._cpp.in_features}, out_features={self._cpp.out_features}, "
                f"bias={self._cpp.bias is not None}")


class LayerNorm(_CppModule):
    """LayerNorm over the last dim with a learned scale (init 1) and shift (init 0)."""

    _copy_by_rebuild = True

    def __init__(self, dim, eps=1e-5):
        super().__init__(_cpp.LayerNorm(dim, eps))


class Embedding(_CppModule):
    """A lookup table [num_embeddings, embedding_dim]; init normal(0, init_std)."""

    _copy_by_rebuild = True

    def __init__(self, num_embeddings, embedding_dim, *, init_std=0.02):
        super().__init__(_cpp.Embedding(num_embeddings, embedding_dim, init_std))


class Dropout(_CppModule):
    """Dropout with loom's reproducible masks, keyed by (dropout seed, this module's full name,
    dropout step, batch part). Right with no call from the script: loom.optim's step() advances
    the dropout step, and DistributedDataParallel / ZeroRedundancyOptimizer set each rank's batch
    part, so masks change every step and dp ranks draw the single-process masks
    (loom/nn/_dropout.py). A module called twice in one step draws the same mask twice."""

    _copy_by_rebuild = True

    def __init__(self, p=0.5):
        super().__init__(_cpp.Dropout(p))


class MLP(_CppModule):
    """GPT-2's feed-forward block: fc (C -> 4C), GELU (tanh), proj (4C -> C), dropout."""

    _copy_by_rebuild = True

    def __init__(self, channels, dropout=0.0, *, proj_std=0.02):
        super().__init__(_cpp.MLP(channels, dropout, proj_std))


class MoE(_CppModule):
    """A mixture of experts replacing the MLP (Switch, Mixtral; core/nn/moe.h).

    Router ``logits = x W_r^T`` (``router.weight`` [experts, C], f32), ``p = softmax(logits)``,
    each token's ``top_k`` experts (ties to the lower index), gates renormalised to sum to 1
    when top_k > 1 and the raw probability when top_k == 1; each expert is the GELU MLP
    (``experts.{e}.fc``, ``experts.{e}.proj``; inner width ``expert_hidden``, 0: 4 x channels);
    the output is the gated sum in expert order,
    then dropout. ``capacity_factor`` c > 0 gives each expert ceil(k x tokens x c / experts)
    tokens, in token order, and drops the rest (0: dropless). After a forward, ``aux_loss`` is
    ``aux_loss_coef * E * sum_e f_e P_e + z_loss_coef * mean(logsumexp(logits)^2)`` (a scalar to
    add to the loss), ``load`` each expert's tokens, ``dropped`` the overflow. f32.

    Dropless routing keeps each rank within a receive budget (``receive_budget_mb`` of the
    experts' activations; 0: a quarter of the memory available at the first forward; < 0: none):
    a forward whose routing would exceed it falls back, with a warning, to keeping the first
    ``budget_capacity`` assignments of each expert (-1 when it did not; See Note [Dropless
    receive budget] in core/nn/moe.h).

    Expert parallelism: with ``ep_group`` (a loom.distributed.Communicator) the experts split
    over its ranks (each holds experts ``first_expert`` .. + ``local_experts``, under their
    single-process names); every rank routes its own tokens, and ``batch_group`` (default: the
    ep group; it must contain it, e.g. the dp group) is whose tokens form one batch: capacity
    drops and the auxiliary losses are the whole batch's, and ``aux_loss`` is this rank's term of
    them: the mean of the batch group's terms is one process's losses, as the mean of the ranks'
    cross-entropies is under data parallelism, so each rank adds it to its loss as one process
    does. Tokens travel to their experts and back by all-to-all. Under
    loom.distributed.DistributedDataParallel over the batch group the step is then one
    process's: DDP leaves each rank's experts out of its broadcast and averaging and gives them
    the same mean (their gradients summed over the ranks holding the same experts, divided by
    the group's size), and loom.nn.utils.clip_grad_norm_ counts each expert once
    (parallel/expert_parallel.h)."""

    _copy_by_rebuild = True

    def __init__(self, channels, experts, top_k=1, *, capacity_factor=0.0, aux_loss_coef=0.01,
                 z_loss_coef=0.001, dropout=0.0, proj_std=0.02, ep_group=None, batch_group=None,
                 receive_budget_mb=0.0, expert_hidden=0):
        if ep_group is None:
            if batch_group is not None:
                raise ValueError("MoE: batch_group needs ep_group (the experts' ranks)")
            cpp = _cpp.MoE(channels, experts, top_k, capacity_factor, aux_loss_coef, z_loss_coef,
                           dropout, proj_std, receive_budget_mb, expert_hidden)
        else:
            cpp = _loom.parallel.ExpertParallelMoE(
                channels, experts, top_k, capacity_factor, aux_loss_coef, z_loss_coef, ep_group,
                batch_group, dropout, proj_std, receive_budget_mb, expert_hidden)
        super().__init__(cpp)
        object.__setattr__(self, "ep_group", ep_group)
        object.__setattr__(self, "batch_group", ep_group if batch_group is None else batch_group)
        if ep_group is not None:
            from loom.nn import _placement
            _placement.register(self)

    def _norm_placements(self):
        """For clip_grad_norm_ (loom/nn/_placement.py): each expert's squares add over the ep
        group, which holds every expert once; the router is whole on every rank."""
        from loom.nn import _placement
        return {p._identity(): _placement.Placement(
                    shard_group=self.ep_group if name.startswith("experts.") else None)
                for name, p in self.named_parameters()}

    def begin_batch(self, parts, record=True):
        """The next batch comes in ``parts`` micro-batches (gradient accumulation), forwarded in
        order; capacity and the load-balancing loss stay the whole batch's. The loss needs the
        whole batch's routing counts before any micro-batch's backward, so with ``record`` (needed
        when ``aux_loss_coef`` > 0) the script first forwards every micro-batch under
        ``loom.no_grad()`` (the routing pass; ``aux_loss`` is then 0), then again for real. With
        expert parallelism every rank's micro-batch k comes before any rank's k + 1. See
        loom.nn.utils.moe_begin_batch and Note [A batch in micro-batches] in core/nn/moe.h."""
        self._cpp.begin_batch(int(parts), bool(record))

    @property
    def first_expert(self):
        return getattr(self._cpp, "first_expert", 0)

    @property
    def local_experts(self):
        return getattr(self._cpp, "local_experts", len(self.load))

    @property
    def aux_loss(self):
        return self._cpp.aux_loss

    @property
    def load(self):
        return list(self._cpp.load)

    @property
    def dropped(self):
        return self._cpp.dropped

    @property
    def budget_capacity(self):
        return self._cpp.budget_capacity


class CausalSelfAttention(_CppModule):
    """GPT-2's causal multi-head self-attention: qkv (C -> 3C), heads, attention, proj."""

    _copy_by_rebuild = True

    def __init__(self, channels, heads, dropout=0.0, *, proj_std=0.02):
        super().__init__(_cpp.CausalSelfAttention(channels, heads, dropout, proj_std))


class Block(_CppModule):
    """A pre-LayerNorm GPT-2 block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    _copy_by_rebuild = True

    def __init__(self, channels, heads, dropout=0.0, *, proj_std=0.02):
        super().__init__(_cpp.Block(channels, heads, dropout, proj_std))


GPTConfig = _cpp.GPTConfig
MoEConfig = _cpp.MoEConfig


class GPT(_CppModule):
    """GPT-2 (token and position embeddings, pre-LN blocks, final LayerNorm, tied output head).

    Parameter names are loom's (Note [GPT parameter names]): wte.weight, wpe.weight,
    blocks.{i}.ln1.weight, blocks.{i}.attn.qkv.weight, ..., ln_f.bias. Example::

        >>> config = loom.nn.GPTConfig(max_seq_len=16, vocab=64, layers=2, heads=2, channels=32)
        >>> model = loom.nn.GPT(config).init_parameters(seed=1337)
        >>> idx = loom.tensor([[1, 2, 3]], dtype=loom.int64)
        >>> model(idx).shape                   # logits over the padded vocabulary
        (1, 3, 64)
        >>> loss = model.loss(idx, loom.tensor([[2, 3, 4]], dtype=loom.int64))
        >>> loss.backward()

    ``moe`` (a loom.nn.MoEConfig) makes block i's MLP a mixture of experts when
    i % moe.every == 0 (loom.nn.MoE, named blocks.{i}.mlp.router.weight and
    blocks.{i}.mlp.experts.{e}.fc / .proj, as loom-gpt --moe-* builds it); ``loss`` then adds the
    MoE layers' auxiliary losses (``last_lm_loss`` is the cross-entropy alone). A file written by
    loom-gpt --save, MoE or not, loads with ``GPT.from_file(path)``.
    """

    _copy_by_rebuild = True

    def __init__(self, config, *, dropout=0.0, checkpoint=False, seed=0, moe=None):
        super().__init__(_cpp.GPT(config, dropout, checkpoint, moe), init_seed=seed)
        object.__setattr__(self, "moe", moe)

    @classmethod
    def from_file(cls, path, *, heads=0, dropout=0.0, allow_nonfinite=False):
        """The GPT a weights file holds (llm.c .bin, Hugging Face GPT-2 .safetensors or
        directory, loom-gpt --save's, with its MoE blocks), its weights loaded (loom.load_gpt)."""
        config, state, moe = _loom.load_gpt(path, heads, allow_nonfinite, with_moe=True)
        model = cls(config, dropout=dropout, moe=moe)
        model.load_state_dict(state)
        return model

    @property
    def config(self):
        return self._cpp.config

    @property
    def last_lm_loss(self):
        """With MoE blocks: the cross-entropy of the last ``loss`` without the auxiliary losses."""
        return self._cpp.last_lm_loss

    def moe_layers(self):
        """The MoE blocks' layers (loom.nn.MoE), in block order; empty for a dense model."""
        return [m for m in self.modules() if isinstance(m, MoE)]

    def loss(self, idx, targets):
        """Mean next-token cross-entropy of forward(idx) against targets [B, T] (-100 ignored)."""
        return self._cpp.loss(idx, targets)

    def set_checkpointing(self, on):
        self._cpp.set_checkpointing(on)

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """nanoGPT's generate with a KV cache: idx [B, T] -> [B, T + max_new_tokens].

        Draws from softmax(logits / temperature) of the last position, over the top_k largest
        logits when given; temperature=0 takes the argmax. The prompt fills the cache once and
        each new token runs alone; past max_seq_len the sequence is cut to its last max_seq_len
        tokens, as nanoGPT does. No autograd; call eval() first, as in PyTorch. The draws come
        from loom's global generator (loom.manual_seed): reproducible on any device, but not
        torch's draws, so only greedy decoding gives PyTorch's tokens (core/nn/generate.h)::

            >>> model.eval()
            >>> out = model.generate(idx, max_new_tokens=20, temperature=0.8, top_k=40)
        """
        return self._cpp.generate(idx, max_new_tokens, temperature, top_k)


class EmbeddingBagCollection(_CppModule):
    """Embedding tables looked up together (DLRM's sparse features), pooled per bag.

    ``tables``: (name, rows, dim) per table, dim a multiple of 4. ``forward(indices, offsets,
    per_sample_weights=None)`` takes CSR indices/offsets, feature-major over the tables, and
    returns [B, sum of dims] for 'sum' / 'mean' pooling. Parameters: "<name>.weight".
    """

    _copy_by_rebuild = True

    def __init__(self, tables, pooling="sum", bounds_check="error"):
        super().__init__(_cpp.EmbeddingBagCollection(list(tables), pooling, bounds_check))

    def forward(self, indices, offsets, per_sample_weights=None):
        return self._cpp.lookup(indices, offsets, per_sample_weights)

    lookup = forward

    @property
    def tables(self):
        return self._cpp.tables


_WRAPPERS = {
    _cpp.Linear: Linear, _cpp.LayerNorm: LayerNorm, _cpp.Embedding: Embedding,
    _cpp.Dropout: Dropout, _cpp.MLP: MLP, _cpp.MoE: MoE, _cpp.CausalSelfAttention: CausalSelfAttention,
    _cpp.Block: Block, _cpp.GPT: GPT, _cpp.EmbeddingBagCollection: EmbeddingBagCollection,
}
