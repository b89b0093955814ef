"""The kernel table's parsers (src/ops/triton/kernel_table.py) on hand-written PTX, SASS and
cuobjdump output, and the static checks (tests/python/kernel_checks.py) on hand-written rows: each
rule shown failing, with its message, and passing at its limit. Run by CTest
(tests/CMakeLists.txt):

    .venv/bin/python tests/python/test_kernel_table.py -v
"""

import os
import subprocess
import sys
import tempfile
import unittest

import kernel_checks  # puts src/ops/triton on the path
import kernel_table

PTX = """
	@%p18 ld.global.v2.b32 { %r462, %r463 }, [ %rd89 + 0 ];
	ld.global.L1::evict_last.b16 %rs1, [ %rd2 + 0 ];
	cp.async.cg.shared.global [ %r224 + 0 ], [ %rd8 + 0 ], 0x10, %r225;
	cp.async.commit_group;
	cp.async.wait_group 2;
	@%p157 atom.global.gpu.acq_rel.add.f32 %r3086, [ %rd591 + 0 ], %r3087;
	@%p158 atom.global.gpu.acq_rel.add.f32 %r3088, [ %rd592 + 0 ], %r3089;
	red.global.add.f32 [ %rd3 + 0 ], %r5;
"""

SASS = """
    /*0000*/       LDC R1, c[0x0][0x28] ;                                  /* 0x00000a00ff017b82 */
    /*0010*/   @P0 LDG.E.LTC128B.64 R4, desc[UR4][R2.64] ;                 /* 0x0000000004bd7fae */
    /*0020*/       LDG.E.U16 R6, desc[UR4][R2.64] ;                        /* 0x0000000004bd7fae */
    /*0a20*/       LDGSTS.E.BYPASS.128 [R189], [R4.64], P6 ;               /* 0x0000000004bd7fae */
    /*0a30*/       LDGDEPBAR ;                                             /* 0x0000000004bd7fae */
    /*0a40*/  @!P1 STL [R1+0x4], R7 ;                                      /* 0x0000000004bd7fae */
    /*0a50*/       STL.64 [R1+0x8], R8 ;                                   /* 0x0000000004bd7fae */
    /*0a60*/       LDL.LU R7, [R1+0x4] ;                                   /* 0x0000000004bd7fae */
    /*0a70*/       MEMBAR.ALL.GPU ;                                        /* 0x0000000004bd7fae */
    /*0a78*/       MEMBAR.ALL.CTA ;                                        /* 0x0000000004bd7fae */
    /*0a80*/       ATOMG.E.ADD.F32.FTZ.RN.STRONG.GPU PT, R3, [R4.64], R5 ; /* 0x0000000004bd7fae */
"""

USAGE = """
Resource usage:
 Common:
  GLOBAL:0
 Function attention_backward_dq:
  REG:255 STACK:32 SHARED:1024 LOCAL:0 CONSTANT[0]:760 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


def clean_row(**changes):
    """A row that breaks no rule: a Base variant on sm_90a, no spills, 48 KB of shared memory
    without an opt-in, 16-byte aligned and 128-bit loads, relaxed atomics."""
    row = {"variant": "gemm_bias_gelu_bf16", "arch": "sm_90a", "entry": "gemm_bias_gelu",
           "warps": 8, "regs": 190, "stack": 0, "local": 0, "stl": 0, "ldl": 0,
           "shared_static": 1024, "shared_dynamic": 48 * 1024 - 1024, "ptx_load_bits": 128,
           "sass_load_bits": 128, "cp_async": 24, "ldgsts": 24,
           "atomics": "atom.global.gpu.add.f32 x2;red.global.gpu.relaxed.add.f32 x1",
           "membars_gpu": 0, "aligned_ptrs": "a_ptr,b_ptr"}
    row.update(changes)
    return row


class Parsers(unittest.TestCase):
    def test_ptx_widest_load_counts_cp_async_and_lists_atomics(self):
        self.assertEqual(kernel_table.ptx_figures(PTX), {
            "ptx_load_bits": 128, "cp_async": 1,
            "atomics": {"atom.global.gpu.acq_rel.add.f32": 2, "red.global.add.f32": 1}})
        self.assertEqual(kernel_table.ptx_figures("ld.global.v4.b32 {%r1}, [%rd1];\n"
                                                  "ld.global.b64 %rd2, [%rd3];")["ptx_load_bits"],
                         128)
        self.assertEqual(kernel_table.ptx_figures("ld.global.b16 %rs1, [%rd1];\n"
                                                  "ld.param.v4.b32 {%r1}, [p];")["ptx_load_bits"],
                         16)

    def test_semantics_default_to_relaxed(self):
        self.assertEqual(kernel_table.semantics("atom.global.gpu.acq_rel.add.f32"), "acq_rel")
        self.assertEqual(kernel_table.semantics("red.global.release.gpu.add.f32"), "release")
        self.assertEqual(kernel_table.semantics("atom.global.add.f32"), "relaxed")

    def test_sass_spills_widths_copies_and_fences(self):
        self.assertEqual(kernel_table.sass_figures(SASS), {
            "stl": 2, "ldl": 1, "sass_load_bits": 128, "ldgsts": 1, "membars_gpu": 1})
        # LTC128B is a cache hint, not a width.
        self.assertEqual(kernel_table.sass_load_bits("LDG.E.LTC128B.64"), 64)
        self.assertEqual(kernel_table.sass_load_bits("LDG.E"), 32)
        self.assertEqual(kernel_table.sass_load_bits("LDG.E.128.CONSTANT"), 128)

    def test_resource_usage(self):
        self.assertEqual(kernel_table.resource_figures(USAGE, "attention_backward_dq"),
                         {"regs": 255, "stack": 32, "local": 0, "shared_static": 1024})
        with self.assertRaisesRegex(SystemExit, "no resource usage for other"):
            kernel_table.resource_figures(USAGE, "other")

    def test_row_records_the_aligned_pointers_and_round_trips(self):
        signature = {"a_ptr": "*bf16:16", "n": "i32:16", "b_ptr": "*fp32", "c_ptr": "*fp32:16"}
        row = kernel_table.row("v", "sm_90a", signature, "attention_backward_dq", 4, 34816, PTX,
                               USAGE + SASS)
        self.assertEqual(row["aligned_ptrs"], "a_ptr,c_ptr")
        self.assertEqual(row["atomics"],
                         "atom.global.gpu.acq_rel.add.f32 x2;red.global.add.f32 x1")
        self.assertEqual(kernel_table.atomics(row),
                         [("atom.global.gpu.acq_rel.add.f32", 2), ("red.global.add.f32", 1)])
        unaligned = kernel_table.row("w", "sm_80", {"x": "*bf16"}, "attention_backward_dq", 4, 0,
                                     "", USAGE)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "kernels.tsv")
            kernel_table.write(path, [row, unaligned])
            self.assertEqual(kernel_table.read(path), [row, unaligned])

    def test_a_table_of_other_columns_is_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "kernels.tsv")
            with open(path, "w") as f:
                f.write("variant\tarch\n")
            with self.assertRaisesRegex(SystemExit, "rebuild the xlme_triton_kernels target"):
                kernel_table.read(path)


class Rules(unittest.TestCase):
    def test_a_clean_row_passes(self):
        self.assertEqual(kernel_checks.violations([clean_row()]), [])

    def test_base_variants(self):
        for name in ("attention_backward_dq_bf16_d64_gated_dropout", "attention_forward_bf16_d64_"
                     "nobias", "masked_lm_forward_bf16_sample", "masked_lm_backward_bf16",
                     "residual_layernorm_backward_fp32_bf16_1024_dropout",
                     "masked_lm_forward_bf16_sample_aligned",
                     "residual_layernorm_backward_fp32_bf16_1024_dropout_aligned",
                     "residual_layernorm_forward_fp32_bf16_1024_aligned", "gemm_dgelu_bgrad_bf16"):
            self.assertTrue(kernel_checks.used_at_base(name), name)
        for name in ("attention_forward_bf16_d32_gated", "masked_lm_forward_fp32",
                     "masked_lm_forward_fp32_aligned", "residual_layernorm_forward_fp32_fp32_1024_"
                     "aligned",
                     "residual_layernorm_forward_fp32_bf16_4096", "residual_layernorm_forward_"
                     "fp32_fp32_1024"):
            self.assertFalse(kernel_checks.used_at_base(name), name)

    def test_a_base_variant_spilling_on_sm90a_fails(self):
        row = clean_row(variant="attention_backward_dq_bf16_d64_gated_dropout", stack=32, stl=9,
                        ldl=7)
        self.assertEqual(kernel_checks.violations([row]), [
            "attention_backward_dq_bf16_d64_gated_dropout on sm_90a spills at Base shapes: 32 "
            "bytes of stack frame, 0 of local memory, 9 STL and 7 LDL instructions (limit: 0)"])
        self.assertEqual(len(kernel_checks.violations([clean_row(ldl=1)])), 1)

    def test_spills_off_base_or_on_sm80_pass(self):
        self.assertEqual(kernel_checks.violations([
            clean_row(variant="attention_backward_dq_bf16_d32_gated_dropout", stack=32, stl=9),
            clean_row(arch="sm_80", stack=296, stl=78, ldl=73)]), [])

    def test_shared_memory_beyond_the_opt_in_fails(self):
        at_limit = clean_row(shared_dynamic=227 * 1024 - 1024)
        self.assertEqual(kernel_checks.violations([at_limit]), [])
        over = clean_row(arch="sm_80", shared_static=0, shared_dynamic=163 * 1024 + 16)
        self.assertEqual(kernel_checks.violations([over]), [
            "gemm_bias_gelu_bf16 on sm_80 uses 166,928 bytes of shared memory (0 static + "
            "166,928 dynamic; limit with the launcher's opt-in: 166,912)"])

    def test_static_shared_memory_past_48kb_without_the_opt_in_fails(self):
        row = clean_row(shared_dynamic=48 * 1024)
        self.assertEqual(kernel_checks.violations([row]), [
            "gemm_bias_gelu_bf16 on sm_90a uses 50,176 bytes of shared memory (1,024 static + "
            "49,152 dynamic; limit: 49,152, as the launcher opts in only above 49,152 dynamic "
            "bytes)"])

    def test_an_unknown_architecture_has_no_limit(self):
        row = clean_row(arch="sm_100a", shared_dynamic=64 * 1024)
        self.assertEqual(kernel_checks.violations([row]), [
            "gemm_bias_gelu_bf16 on sm_100a: no shared-memory limit known for sm_100a (add it to "
            "OPT_IN_LIMIT in tests/python/kernel_checks.py)"])

    def test_promised_alignment_without_16_byte_loads_fails(self):
        row = clean_row(sass_load_bits=64, ptx_load_bits=64)
        self.assertEqual(kernel_checks.violations([row]), [
            "gemm_bias_gelu_bf16 on sm_90a: its signature promises 16-byte aligned a_ptr,b_ptr "
            "but its widest global load is 64 bits (PTX: 64; limit: at least 128)"])
        self.assertEqual(kernel_checks.violations([clean_row(sass_load_bits=16,
                                                             aligned_ptrs="")]), [])

    def test_atomics_stronger_than_relaxed_fail(self):
        row = clean_row(atomics="atom.global.gpu.acq_rel.add.f32 x34;atom.global.add.f32 x1",
                        membars_gpu=34)
        self.assertEqual(kernel_checks.violations([row]), [
            "gemm_bias_gelu_bf16 on sm_90a: 34 x atom.global.gpu.acq_rel.add.f32, acq_rel "
            "semantics, and 34 GPU-scope MEMBAR fences in its SASS (limit: relaxed)"])
        for sem in ("acquire", "release", "sc"):
            row = clean_row(atomics=f"red.global.{sem}.gpu.add.f32 x1")
            self.assertEqual(len(kernel_checks.violations([row])), 1, sem)

    def test_the_command_fails_naming_each_violation(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "kernels.tsv")
            script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_checks.py")
            kernel_table.write(path, [clean_row(), clean_row(arch="sm_80", sass_load_bits=32)])
            run = subprocess.run([sys.executable, script, path], capture_output=True, text=True)
            self.assertEqual(run.returncode, 1)
            self.assertIn("gemm_bias_gelu_bf16 on sm_80: its signature promises", run.stdout)
            self.assertIn(f"1 violation in {path}", run.stderr)
            kernel_table.write(path, [clean_row()])
            run = subprocess.run([sys.executable, script, path], capture_output=True, text=True)
            self.assertEqual((run.returncode, run.stdout.strip()),
                             (0, f"{path}: all 1 kernels (variant x architecture) pass"))
            run = subprocess.run([sys.executable, script, path + ".missing"], capture_output=True,
                                 text=True)
            self.assertEqual(run.returncode, 1)
            self.assertIn("build the xlme_triton_kernels target first", run.stderr)


if __name__ == "__main__":
    unittest.main()
