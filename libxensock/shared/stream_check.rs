// SPDX-License-Identifier: MIT OR Apache-2.0
//! The checksummed test stream shared by `xensock demo` and the lab's
//! `lab_echo` example: both ends of a lab run must compute the same values,
//! so there is one copy, included with `#[path]` by both programs.

/// Position-dependent checksum of a byte stream (detects loss, duplication
/// and reordering), independent of how the stream is cut into reads.
#[derive(Default, Clone, Copy)]
pub struct Sum(u64, u64, [u8; 8], usize);
impl Sum {
    fn word(&mut self, w: [u8; 8]) {
        self.1 = self.1.wrapping_add(1);
        self.0 = (self.0.rotate_left(7) ^ u64::from_le_bytes(w))
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ self.1;
    }
    pub fn add(&mut self, mut data: &[u8]) {
        if self.3 > 0 {
            let n = (8 - self.3).min(data.len());
            self.2[self.3..self.3 + n].copy_from_slice(&data[..n]);
            self.3 += n;
            data = &data[n..];
            if self.3 < 8 {
                return;
            }
            let w = self.2;
            self.word(w);
            self.3 = 0;
        }
        let mut it = data.chunks_exact(8);
        for c in &mut it {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.word(w);
        }
        let rest = it.remainder();
        self.2[..rest.len()].copy_from_slice(rest);
        self.3 = rest.len();
    }
    pub fn finish(mut self) -> u64 {
        if self.3 > 0 {
            let mut w = [0u8; 8];
            w[..self.3].copy_from_slice(&self.2[..self.3]);
            self.word(w);
        }
        self.0
    }
}

/// `len` bytes of a fixed xorshift stream.
pub fn pattern(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Writes `total` bytes in `write_size` writes, each starting at a varying
/// offset of `block` (from [`pattern`], `write_size + 8192` long), so that
/// lost, duplicated or reordered data changes the checksum; returns the
/// checksum of what was written.
pub fn write_stream(
    w: &mut impl std::io::Write,
    block: &[u8],
    total: u64,
    write_size: usize,
) -> std::io::Result<u64> {
    let mut sum = Sum::default();
    let mut sent = 0u64;
    let mut i = 0usize;
    while sent < total {
        let n = ((total - sent) as usize).min(write_size);
        let off = (i * 4093) % 8192;
        let chunk = &block[off..off + n];
        sum.add(chunk);
        w.write_all(chunk)?;
        sent += n as u64;
        i += 1;
    }
    Ok(sum.finish())
}

/// Reads to EOF; returns (checksum, bytes read). `progress` sees the running
/// byte count after every read.
pub fn read_stream(
    r: &mut impl std::io::Read,
    mut progress: impl FnMut(u64),
) -> std::io::Result<(u64, u64)> {
    let mut buf = vec![0u8; 256 * 1024];
    let mut sum = Sum::default();
    let mut got = 0u64;
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        sum.add(&buf[..n]);
        got += n as u64;
        progress(got);
    }
    Ok((sum.finish(), got))
}
