"""Record checkpoints from any training loop into the store (``landscape.Recorder``).

::

    with landscape.Recorder("checkpoints", "my-run", model, data=data, config={"lr": 0.05}) as rec:
        for epoch in range(epochs):
            ...                                   # the user's own loop, on any device
            rec.save(step, epoch=epoch + 1, metrics={"train_loss": loss})

A recorded run is a store run like the ones ``landscape train`` writes: the same atomic checkpoint and
manifest writes, the run's write lock from the first file to the last (:class:`landscape.store.Run`), sha256
of every checkpoint, the code version of landscape (manifest and checkpoints), and the model and data specs
analyses rebuild the model and data from, so every analysis reads it exactly as a trained run. The manifest
adds ``config`` (the user's, as given), ``recorder`` (format, the ``__main__`` script and its sha256, torch and
python versions), ``device`` (the model's) and ``privacy`` (a DP run's noise multiplier, sample rate, clipping norm, delta, accountant;
:mod:`landscape.integrations.opacus` reads them from an Opacus ``PrivacyEngine``; else a run without privacy
guarantee), so ``landscape train --from`` a recorded checkpoint composes its DP steps like a trained parent's.

A run recorded from a store checkpoint (``parent="base@last"``, as ``landscape train --from``) starts from the
parent's weights, records its lineage (``parent_run``, ``parent_step``, ``parent_sha256``, ...) and the
parent's privacy history (:func:`landscape.train.pruning.inherited_privacy`), and each checkpoint's epsilon
composes the parent's DP steps with the run's own (and adds declared guarantees), as a trained child's does.

The writers: where each checkpoint is written, chosen when the recorder opens (``writer=``). Either way the
run's files are byte for byte what the same :class:`landscape.store.Run` calls give (``landscape train``'s),
and the guarantees below hold.

- ``"inline"``: the training process writes each checkpoint before :meth:`Recorder.save` returns and holds
  the run's write lock itself (a second recorder of the same run, in this process or another, is refused,
  :class:`landscape.store.RunBusyError`). A save costs the training loop the whole write (HDF5, sha256, the
  manifest, four fsyncs: milliseconds even for a small model, growing with its size); nothing else.
- ``"process"``: the run belongs to a *writer process*, a fresh Python interpreter started when the recorder
  opens (:mod:`landscape.recorder.writer_main`: not a fork of the training process; it imports the store, numpy
  and h5py, never torch nor the user's code, and reads only JSON and raw tensor bytes, never a pickle). It takes
  the run's write lock, creates or opens the run and writes every file, while training goes on. The recorder
  waits for it to open a run that exists (to continue it: a run someone else wrote, or one a live writer holds,
  is refused there and then), not to create a new one: that happens while training starts, and its failure (say,
  the name taken by another process a moment earlier) is raised by the first call after the writer has
  answered, or that waits for it (``flush``, ``close``, :attr:`Recorder.run`). The writer ignores Ctrl-C (the
  parent decides when to stop) and dies with its parent (:func:`landscape.runtime.die_with_parent`: SIGKILL
  when the parent dies, however it dies). :meth:`Recorder.save` checks and copies what it records in the
  training process (weights and optimizer state as CPU tensors, metrics, the accountant's epsilon and state),
  puts the bytes into an anonymous in-memory file whose descriptor it passes to the writer, and returns while
  the writer writes. Checkpoints are written in order; up to
  :data:`landscape.recorder.writer.MAX_IN_FLIGHT` may be in flight (and
  :data:`~landscape.recorder.writer.MAX_BYTES_IN_FLIGHT` bytes; a ``save`` beyond waits for the oldest), so
  that the first saves need not wait while the writer starts. A failed write's error (one line) is raised by
  the next ``save``, ``flush`` or ``close``; the checkpoints sent after it are not written (a trajectory gets
  no later checkpoint over a missing one), and the recorder's last step is the run's on disk again.
  :meth:`Recorder.flush`, :meth:`Recorder.close` and the end of the ``with`` block wait for every checkpoint
  in flight, and they are written at interpreter exit too (``background=False`` waits before each ``save``
  returns). Its costs: starting it (``posix_spawn``, whatever the size of the training process), copying each
  checkpoint once into memory, and ``close`` waiting for the last write; the writer's start (its imports) and
  its writes run on another core. Between two checkpoints the writer makes the next one's file from the last
  one's layout (:meth:`landscape.store.Run.prepare_checkpoint`), so the last write at ``close`` is data, attrs,
  fsyncs and renames. (Not a fork: forking copies the page tables of the whole training process
  and makes it take copy-on-write faults while the writer lives. Not a thread: a write holds Python's GIL for
  milliseconds, and a writer thread waits up to the 5 ms switch interval for the GIL after every system call,
  stalling a CPU-bound loop for longer than the write.)
- ``"auto"`` (the default): the writer process when a CPU core is free for it (:func:`spare_cores`: the cores
  this process may use, less ``torch.get_num_threads()`` for a model on the CPU or one for a model on an
  accelerator), else inline. Which was chosen is :attr:`Recorder.writer`. The rule follows what each costs
  (measured by ``benchmarks/recorder.py``, numbers in docs/own-code.md): an inline save costs the loop its
  whole write every time, growing with the checkpoint's size; the writer process costs its start and the last
  write at close, and a copy per save, *if* a core is free to write on: without one it writes on the loop's
  cores and costs more than inline. Give ``writer=`` to decide yourself (say ``"inline"`` when data loader
  workers take the spare cores, or for a run of one or two checkpoints).

Crash safety is the store's: a training process killed at any moment (a writer process then dies with it)
loses at most the checkpoints not yet written (inline: the one being written; the writer process: those in
flight), every file and the manifest stay whole, and the same ``Recorder`` call continues the run. Durability
is the store's too: when ``save`` (inline), ``flush`` or ``close`` returns, every checkpoint saved and the
manifest that lists it are fsynced, their renames too (a power cut then loses nothing written).

Continuing a killed run: the same ``Recorder(root, run, ...)`` again opens the run (with the same model, data,
config, privacy and parent; anything else is refused in one line), :meth:`Recorder.restore` puts the last
checkpoint's weights, optimizer state and privacy accountant back and returns its step, and
:meth:`Recorder.save` refuses any step that does not come after it. A run written by anyone else (``landscape
train``, ``import``, another model or data set) is never written to. Weights that are not finite are refused,
nothing saved.
"""

from __future__ import annotations

from typing import Any

__all__ = ["OPTIMIZER_ATTR", "OPTIMIZER_EXTRA", "PRIVACY_ATTR", "RECORDER_FORMAT", "PrivacySource", "Recorder",
           "spare_cores", "unwrap"]


def __getattr__(name: str) -> Any:
    """The recorder's names (:mod:`landscape.recorder.core`), imported on first use: the writer process imports
    :mod:`landscape.recorder.writer_main` without torch."""
    if name in __all__:
        from landscape.recorder import core

        return getattr(core, name)
    raise AttributeError(f"module 'landscape.recorder' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
