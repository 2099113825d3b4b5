"""Broken on purpose: a render process that dies while idle takes its slot with it (issue 23 defect 1).

The reference's render pool, when the idle process it takes has died (an OOM killer, a cgroup kill), replaces it and
takes the next idle one. This variant submits the render outside any ``try``, as the reference once did: the broken
executor's ``BrokenProcessPool`` is raised at the submit, the executor is neither put back nor replaced, and once
``IMAGE_WORKERS`` processes died that way every later render waits for ever for an idle process while the worker
keeps renewing the lease of the job it holds.

Everything else is the reference.
"""

import asyncio
import sys

from reference import imaging
from reference import worker_render
from reference.cli import main


async def render_losing_dead_executors(self, data, variants, pixels=None):
    executor = await self.idle.get()
    # THE BUG: a dead idle process makes this raise, and the executor taken from the queue is lost
    future = asyncio.get_running_loop().run_in_executor(executor, imaging.render_variants, data, variants,
                                                        self.limits)
    try:
        return await self._finish(executor, future, keep_replacement=False)
    except worker_render._OverLimit:
        raise imaging.ImageRejected("decode_timeout", f"over {self.timeout:g}s") from None


worker_render.RenderPool.render = render_losing_dead_executors

if __name__ == "__main__":
    sys.exit(main())
