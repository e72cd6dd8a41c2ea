"""OpenVINO computing f32 models in f32 on any CPU, for a child process.

On a CPU with AVX512-BF16 or AMX, OpenVINO's CPU plugin computes f32 models
in bf16 unless told otherwise, and the ExecuTorch runtime imports blobs with
no properties. The one setting that reaches it is a ``plugins.xml`` beside
``libopenvino.so`` (docs/precision.md). Rather than edit the installed
package, the child runs with a copy of it first on its path, the copy's
``plugins.xml`` giving the CPU plugin ``INFERENCE_PRECISION_HINT=f32``: its
OpenVINO Python API and the runtime's OpenVINO alike compute in f32.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

PLUGINS_XML = """<ie>
    <plugins>
        <plugin name="CPU" location="libopenvino_intel_cpu_plugin.so">
            <properties>
                <property key="INFERENCE_PRECISION_HINT" value="f32"/>
            </properties>
        </plugin>
    </plugins>
</ie>
"""


def f32_environment(directory: Path) -> dict[str, str]:
    """The environment of a child process whose OpenVINO computes f32 models in f32, with a copy
    of the installed ``openvino`` package in ``directory`` (made once)."""
    spec = importlib.util.find_spec("openvino")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("openvino is not installed")
    package = directory / "openvino"
    if not (package / "libs" / "plugins.xml").exists():
        shutil.copytree(spec.submodule_search_locations[0], package, dirs_exist_ok=True)
        (package / "libs" / "plugins.xml").write_text(PLUGINS_XML)
    c_libraries = sorted((package / "libs").glob("libopenvino_c.so*"))
    if not c_libraries:
        raise RuntimeError(f"no libopenvino_c.so in {package / 'libs'}: the openvino package is incomplete")
    c_library = c_libraries[0]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(directory), *filter(None, [env.get("PYTHONPATH")])])
    # ExecuTorch's runtime dlopens the C library this names (its Python binding sets it once,
    # from the openvino package it finds, unless it is set already: as it is in a parent that ran it).
    env["OPENVINO_LIB_PATH"] = str(c_library)
    return env
