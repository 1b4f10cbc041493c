#!/usr/bin/env python3
"""Rewrites a .cu file into plain C++ for the CPU emulator (kernels/emu/emulated_cuda_runtime.h): the
triple-chevron launches become ::emu::launch(grid, block, smem, body) calls and extern dynamic
shared arrays become pointers into the emulator's per-block buffer. Nothing else changes, so the
emulated code is the kernel source itself. Usage: rewrite_launches.py IN.cu OUT.cpp"""
import re, sys, pathlib
src = pathlib.Path(sys.argv[1]).read_text()
# extern dynamic shared memory -> pointer into the emulator's per-block buffer
src = re.sub(r'extern __shared__ (?:__align__\(\d+\) )?([\w ]+?) (\w+)\[\];',
             lambda m: f'{m.group(1)}* {m.group(2)} = reinterpret_cast<{m.group(1)}*>(::emu::dynamic_smem());', src)
def launch(m):
    kernel, cfg, args = m.group(1), m.group(2), m.group(3)
    parts = [p.strip() for p in cfg.split(',')]
    while len(parts) < 4: parts.append('0')
    return f'::emu::launch(dim3({parts[0]}), dim3({parts[1]}), {parts[2]}, [&] {{ {kernel}({args}); }});'
src = re.sub(r'([\w:<>]+?)<<<(.*?)>>>\((.*?)\);', launch, src, flags=re.S)
pathlib.Path(sys.argv[2]).write_text(src)
