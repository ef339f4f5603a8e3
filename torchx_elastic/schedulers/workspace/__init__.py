"""Workspaces: the user's working directory built as a layer on the role's image.

``mixin.WorkspaceImages`` gives the docker and kubernetes schedulers torchx's workspace
hooks; ``context`` reads the workspace (``.dockerignore`` honoured) into a deterministic
build context; ``image`` names, builds and pushes the image. docker-py is imported lazily.
"""

from torchx_elastic.schedulers.workspace.image import WorkspaceBuild
from torchx_elastic.schedulers.workspace.mixin import WorkspaceImages

__all__ = ["WorkspaceBuild", "WorkspaceImages"]
