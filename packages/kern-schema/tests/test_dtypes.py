from kern_schema import DTYPES, POINTER_SIZE, SCALARS


def test_dtype_table_is_the_design_list_with_sizes():
    assert DTYPES == {
        "bf16": 2, "f16": 2, "f32": 4, "f64": 8, "i8": 1, "u8": 1, "i16": 2, "u16": 2,
        "i32": 4, "u32": 4, "i64": 8, "u64": 8, "fp8e4m3": 1, "fp8e5m2": 1,
    }
    assert POINTER_SIZE == 8


def test_integer_scalar_ranges_are_the_c_ranges():
    for name, bits in (("8", 8), ("16", 16), ("32", 32), ("64", 64)):
        s, u = SCALARS["i" + name], SCALARS["u" + name]
        assert (s.lo, s.hi, s.size, s.is_float) == (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1, bits // 8, False)
        assert (u.lo, u.hi, u.size, u.is_float) == (0, 2**bits - 1, bits // 8, False)


def test_float_scalars_and_contains():
    f32, f64 = SCALARS["f32"], SCALARS["f64"]
    assert f32.is_float and f32.size == 4 and f32.hi == 3.4028234663852886e38
    assert f64.is_float and f64.size == 8 and f64.hi == 1.7976931348623157e308
    i32 = SCALARS["i32"]
    assert i32.contains(-(2**31), 2**31 - 1)
    assert not i32.contains(0, 2**31)
    assert not SCALARS["u32"].contains(-1, 0)
    assert f32.contains(-1e-6, 1e38) and not f32.contains(0, 1e39)
    assert list(SCALARS) == ["i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64", "f32", "f64"]
