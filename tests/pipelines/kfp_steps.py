"""The pipeline whose compiled training step the real-node test runs (needs ``kfp``).

``-j 2x1`` of ``examples/timed.py`` on the image the real-node tests load into the node; its
inputs (how long to train, which rank fails) flow into the script's arguments.
``tests/pipelines/golden/real_node_step.yaml`` is its compiled form: the KFP compile test
checks that compiling it gives that file, and ``test_pipelines_real_node.py`` runs it.
"""

from kfp import dsl

from torchx_elastic.components.dist import ddp
from torchx_elastic.pipelines.kfp import component_from_app, pipeline_input

NODE_IMAGE = "torchx-elastic-e2e:latest"  # test_real_node.NODE_IMAGE (that module needs torch)
OUTPUT = f"/workspace/model-{pipeline_input('seconds')}s.pt"

train = component_from_app(
    ddp(
        "--seconds",
        pipeline_input("seconds"),
        "--crash-rank",
        pipeline_input("crash_rank"),
        script="examples/timed.py",
        j="2x1",
        cpu=0.5,
        image=NODE_IMAGE,
    ),  # fmt: skip
    inputs={"seconds": float, "crash_rank": int},
    outputs={"checkpoint": OUTPUT},
    name="train",
)


@dsl.pipeline(name="real-node-step")
def pipeline(seconds: float = 5, crash_rank: int = -1) -> str:
    return train(seconds=seconds, crash_rank=crash_rank).outputs["checkpoint"]  # type: ignore[no-any-return]
