"""The trainer's end-of-run teardown: CUDA graphs freed before the process group goes, the writer's manager stopped."""

from __future__ import annotations

import psutil

from harness.train import trainer


class FakeGraph:
    """Stands in for torch.cuda.CUDAGraph: records reset()."""

    def __init__(self):
        self.was_reset = False

    def reset(self):
        self.was_reset = True


class FakeEngine:
    """A StepEngine's captured graphs."""

    def __init__(self):
        self.graphs = {"train": FakeGraph(), "eval": FakeGraph()}


def test_release_cuda_graphs_resets_and_drops_every_graph():
    """Both captured graphs are reset and the engine keeps none (nothing pins NCCL's communicator)."""
    engine = FakeEngine()
    graphs = list(engine.graphs.values())
    trainer.release_cuda_graphs(engine)
    assert all(g.was_reset for g in graphs) and engine.graphs == {}


def test_stop_checkpoint_writer_ends_the_result_queue_manager():
    """dist_checkpointing's result-queue manager process is gone after the teardown, and a second call is a no-op."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    queue = filesystem_async._get_write_results_queue()
    manager = psutil.Process(queue._manager._process.pid)
    assert manager.is_running()
    trainer.stop_checkpoint_writer()
    assert filesystem_async._results_queue is None
    manager.wait(timeout=10)
    assert not manager.is_running()
    trainer.stop_checkpoint_writer()
