//! A component that costs far more to compile than its size: one core function that pushes
//! `values` 64-bit constants and adds them up. Cranelift keeps every value live at once: about
//! 10 µs and 1 KiB of compiler memory a value (measured: 200 000 values, a 1 MB module, 1.8 s
//! and 174 MB; a million, 10 s and 1.1 GB). Encoded here by hand, byte by byte, from the core
//! and component binary formats: no tool makes a module this shape.

/// The component's bytes (a component wrapping one core module; no exports: it is refused at
/// binding, after the compile it is meant to load).
pub fn costly_component(values: u32) -> Vec<u8> {
    let mut body = Vec::new();
    for i in 0..values {
        body.push(0x42); // i64.const
        sleb128(&mut body, i64::from(i));
    }
    body.extend(std::iter::repeat_n(0x7c, values.saturating_sub(1) as usize)); // i64.add
    body.push(0x0b); // end
    let mut code = vec![0x00]; // no local declarations
    code.extend(body);
    let mut core = b"\0asm\x01\0\0\0".to_vec();
    // type 0: () -> i64; function 0 of type 0; its code.
    section(&mut core, 1, &[0x01, 0x60, 0x00, 0x01, 0x7e]);
    section(&mut core, 3, &[0x01, 0x00]);
    let mut codes = vec![0x01];
    uleb128(&mut codes, code.len() as u64);
    codes.extend(code);
    section(&mut core, 10, &codes);
    let mut component = b"\0asm\x0d\0\x01\0".to_vec();
    section(&mut component, 1, &core); // a core module section
    component
}

fn section(out: &mut Vec<u8>, id: u8, payload: &[u8]) {
    out.push(id);
    uleb128(out, payload.len() as u64);
    out.extend_from_slice(payload);
}

fn uleb128(out: &mut Vec<u8>, mut n: u64) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn sleb128(out: &mut Vec<u8>, mut n: i64) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        let done = (n == 0 && byte & 0x40 == 0) || (n == -1 && byte & 0x40 != 0);
        out.push(if done { byte } else { byte | 0x80 });
        if done {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    /// A small case, laid out by hand as the binary formats define it.
    #[test]
    fn the_encoding_is_the_formats() {
        let c = super::costly_component(2);
        assert_eq!(
            c,
            [
                b"\0asm\x0d\0\x01\0".as_slice(),
                &[0x01, 30],
                b"\0asm\x01\0\0\0",
                &[1, 5, 1, 0x60, 0, 1, 0x7e],
                &[3, 2, 1, 0],
                &[10, 9, 1, 7, 0, 0x42, 0, 0x42, 1, 0x7c, 0x0b],
            ]
            .concat()
        );
    }
}
