"""A Kubeflow Pipelines (v2) pipeline of two steps: prepare a run directory, then train on
1 to 2 nodes of 2 processes (``-j 1:2x2``) with torchx-elastic, handing on the checkpoint.

    pip install 'torchx-elastic[kfp]'
    python examples/kfp_pipeline.py docs/kfp_pipeline.yaml   # compile

Both steps mount the PersistentVolumeClaim ``training-data`` at ``/data`` (the training
job's pods through ``mounts``; the prepare step is yours: mount it there with
kfp-kubernetes' ``mount_pvc``). See docs/pipelines.md.
"""

import sys

from kfp import compiler, dsl

from torchx_elastic.components.dist import ddp
from torchx_elastic.pipelines.kfp import component_from_app, pipeline_input

IMAGE = "registry.example.com/team/torchx-elastic:v1"
RUN_DIR = pipeline_input("run_dir")

train = component_from_app(
    ddp(
        "--checkpoint",
        f"{RUN_DIR}/model.pt",
        "--steps",
        pipeline_input("steps"),
        script="examples/resume.py",
        j="1:2x2",
        cpu=1,
        memMB=2048,
        image=IMAGE,
        mounts=["type=volume", "src=training-data", "dst=/data"],
    ),  # fmt: skip
    inputs={"run_dir": str, "steps": int},
    outputs={"checkpoint": f"{RUN_DIR}/model.pt"},
    cfg="ttl_seconds_after_finished=3600",
    name="train",
)


@dsl.container_component
def prepare(run_dir: dsl.OutputPath(str)):  # type: ignore[no-untyped-def,valid-type]
    """Makes a directory for this run on the shared volume and hands its path on."""
    script = 'd=/data/runs/`date +%s`; mkdir -p "$d"; printf %s "$d" > "$0"'
    return dsl.ContainerSpec(image=IMAGE, command=["sh", "-c", script, run_dir])


@dsl.pipeline(name="prepare-and-train")
def pipeline(steps: int = 60) -> str:
    run_dir = prepare().outputs["run_dir"]
    return train(run_dir=run_dir, steps=steps).outputs["checkpoint"]  # type: ignore[no-any-return]


if __name__ == "__main__":
    compiler.Compiler().compile(pipeline, sys.argv[1] if len(sys.argv) > 1 else "pipeline.yaml")
