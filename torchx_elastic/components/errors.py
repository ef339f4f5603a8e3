"""The base of every error a component raises for an argument that cannot make a job."""


class ComponentArgumentError(ValueError):
    """A component argument (or a combination of them) that cannot make a job: its message
    says what was wrong and what is accepted. The torchx CLI prints it alone, without a
    traceback (``schedulers/cli_commands.py``); it is a ``ValueError`` for a pipeline that
    builds the AppDef itself."""
