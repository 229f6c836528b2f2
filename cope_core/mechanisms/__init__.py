"""Execution mechanisms on torch, written once and shared by the reference executor
(:mod:`cope_core.executor`) and the profiler (:mod:`cope_core.profile.measure`).

- :mod:`.accelerator`: CUDA or an emulated accelerator (streams, events, device/pinned memory)
- :mod:`.weights`: synthetic weights, the host expert store, slot pools
- :mod:`.experts`: expert FFN compute and the dense reference
- :mod:`.execution`: the four execution strategies and the layer-partition layers
- :mod:`.residency`: the three residency mechanisms and the prefetch path
- :mod:`.shared`: policy-invariant decode work with the model's shapes
- :mod:`.rig`: wiring; :mod:`.timing`: stable timings; :mod:`.probe`: measured peak numbers
"""
from .accelerator import Accelerator
from .execution import (
                        ExpertRunner,
                        LayerIO,
                        run_cost_selected,
                        run_cpu_layer,
                        run_execution,
                        run_gpu_layer,
                        run_parallel,
                        run_ready_first,
                        run_wait_then_gpu,
)
from .residency import CrossLayerState, PerLayerState, ResidencyState, make_state, prefetch_step
from .rig import Rig
from .threads import host_threads, pin_thread_budget
from .timing import StopRule, Timing, timed, until_stable
from .weights import model_dtype

__all__ = ["Accelerator", "CrossLayerState", "ExpertRunner", "LayerIO", "PerLayerState",
           "ResidencyState", "Rig", "StopRule", "Timing", "host_threads", "make_state",
           "model_dtype", "pin_thread_budget", "prefetch_step", "run_cost_selected",
           "run_cpu_layer", "run_execution", "run_gpu_layer", "run_parallel", "run_ready_first",
           "run_wait_then_gpu", "timed", "until_stable"]
