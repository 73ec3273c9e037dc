"""Install ``lightning_rex.pth`` beside the package: the startup hook (src/_lightning_rex_hook.py).

Everything else about the build is in pyproject.toml. A ``.pth`` file is not a module, so
setuptools needs to be told to put it at the top of the wheel: ``build_py`` copies it next to
the modules of a regular build, and an editable install (``pip install -e .``) gets it in its
wheel too. Where a future setuptools drops the editable hook, an editable install still
works; only ``strategy="rex"`` then needs ``import lightning_rex``.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = Path("src", "lightning_rex.pth")


class BuildPyWithPth(build_py):
    """build_py that also copies the startup hook's ``.pth`` into the build."""

    def run(self) -> None:
        super().run()
        self.copy_file(str(PTH), str(Path(self.build_lib, PTH.name)), preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib, PTH.name))]


class EditableWithPth(editable_wheel):
    """editable_wheel that puts the ``.pth`` at the top of the editable wheel as well."""

    def _run_build_commands(self, dist_name, unpacked_wheel, build_lib, tmp_dir):  # type: ignore[no-untyped-def]
        out = super()._run_build_commands(dist_name, unpacked_wheel, build_lib, tmp_dir)
        self.copy_file(str(PTH), str(Path(unpacked_wheel, PTH.name)), preserve_mode=False)
        return out


cmdclass: dict[str, type] = {"build_py": BuildPyWithPth}
if hasattr(editable_wheel, "_run_build_commands"):
    cmdclass["editable_wheel"] = EditableWithPth

setup(cmdclass=cmdclass)
