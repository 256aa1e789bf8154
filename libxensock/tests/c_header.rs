// SPDX-License-Identifier: MIT OR Apache-2.0
//! The C side of the kernel family, checked with a real C compiler:
//! `struct sockaddr_xen` from `af-xen-kmod/include/xensock.h` has the
//! layout libxensock encodes, and the README's C example compiles.
//! Needs `cc` (or `$CC`); `scripts/test` installs gcc.

use std::path::{Path, PathBuf};
use std::process::Command;

use libxensock::{decode_sockaddr, encode_sockaddr, SockAddrXen, SOCKADDR_XEN_LEN};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn include_dir() -> PathBuf {
    repo().join("af-xen-kmod/include")
}

fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("libxensock-c-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn compile(src: &Path, out: &Path, extra: &[&str]) {
    let o = Command::new(cc())
        .args(["-std=gnu11", "-Wall", "-Werror", "-I"])
        .arg(include_dir())
        .args(extra)
        .arg("-o")
        .arg(out)
        .arg(src)
        .output()
        .unwrap_or_else(|e| panic!("running {} (a C compiler is needed): {e}", cc()));
    assert!(
        o.status.success(),
        "{} failed on {}:\n{}",
        cc(),
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn sockaddr_xen_layout_matches_the_c_header() {
    let d = scratch("layout");
    let src = d.join("layout.c");
    std::fs::write(
        &src,
        r#"#include <stddef.h>
#include <stdio.h>
#include "xensock.h"
int main(void)
{
	struct sockaddr_xen a = { .sxen_family = 19, .sxen_port = 0x01020304u, .sxen_domid = 7 };
	const unsigned char *p = (const unsigned char *)&a;
	printf("%zu %zu %zu %zu %zu %zu\n", sizeof a, offsetof(struct sockaddr_xen, sxen_family),
	       offsetof(struct sockaddr_xen, sxen_flags), offsetof(struct sockaddr_xen, sxen_port),
	       offsetof(struct sockaddr_xen, sxen_domid), offsetof(struct sockaddr_xen, sxen_zero));
	for (size_t i = 0; i < sizeof a; i++)
		printf("%02x", p[i]);
	printf("\n%u %u %u\n", XEN_DOMID_SELF, XEN_DOMID_ANY, XEN_PORT_ANY);
	return 0;
}
"#,
    )
    .unwrap();
    let exe = d.join("layout");
    compile(&src, &exe, &[]);
    let out = Command::new(&exe).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next().unwrap(),
        format!("{SOCKADDR_XEN_LEN} 0 2 4 8 12"),
        "sizeof and offsets of sxen_family, sxen_flags, sxen_port, sxen_domid, sxen_zero"
    );
    let rust = encode_sockaddr(19, SockAddrXen::new(7, 0x0102_0304));
    let hex: String = rust.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(lines.next().unwrap(), hex, "bytes of the same address");
    assert_eq!(
        lines.next().unwrap(),
        format!(
            "{} {} {}",
            libxensock::DOMID_SELF,
            libxensock::DOMID_ANY,
            libxensock::PORT_ANY
        ),
        "XEN_DOMID_SELF, XEN_DOMID_ANY, XEN_PORT_ANY"
    );
    assert_eq!(
        decode_sockaddr(19, &rust).unwrap(),
        SockAddrXen::new(7, 0x0102_0304)
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// The ```c block that follows the `c-example` marker in README.md.
fn readme_c_example() -> String {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let at = readme
        .find("<!-- c-example")
        .expect("README.md has a <!-- c-example --> marker");
    let rest = &readme[at..];
    let start = rest.find("```c\n").expect("a ```c block after the marker") + 5;
    let len = rest[start..].find("\n```").expect("the block ends");
    rest[start..start + len + 1].to_string()
}

#[test]
fn readme_c_example_compiles() {
    let code = readme_c_example();
    assert!(
        code.contains("xensock_family()") && code.contains("struct sockaddr_xen"),
        "the README example uses the header"
    );
    for call in ["socket(", "bind(", "listen(", "accept(", "connect("] {
        assert!(code.contains(call), "the README example calls {call}");
    }
    // examples/c/xen-echo.c is the same program (after its comment)
    let file = std::fs::read_to_string(repo().join("examples/c/xen-echo.c")).unwrap();
    let body = &file[file.find("#include").expect("the file has the program")..];
    assert_eq!(body, code, "examples/c/xen-echo.c and the README differ");
    let d = scratch("readme");
    let src = d.join("xen-echo.c");
    std::fs::write(&src, code).unwrap();
    // compiled and linked: a program that builds, not just a fragment
    compile(&src, &d.join("xen-echo"), &[]);
    let _ = std::fs::remove_dir_all(&d);
}

/// The installed header: every public name in a C89 and a C++ translation
/// unit (the strictest its users build with), and none of the lab's
/// test and benchmark knobs (they are in the uninstalled xensock-lab.h).
#[test]
fn public_header_builds_as_c89_and_cxx_without_lab_knobs() {
    let dir = scratch("dialects");
    let src = r#"#include "xensock.h"
int use_everything(void)
{
	struct sockaddr_xen a;
	struct xensock_resolve r;
	struct xensock_graft g;
	unsigned long ioc[3];
	a.sxen_domid = XEN_DOMID_ANY;
	a.sxen_port = XEN_PORT_ANY;
	r.domid = XEN_DOMID_SELF;
	g.fd = XENSOCK_REUSEPORT;
	ioc[0] = XENSOCK_IOC_RESOLVE;
	ioc[1] = XENSOCK_IOC_GRAFT;
	ioc[2] = XENSOCK_IOC_LOCAL_DOMID;
	return xensock_family() + (int)a.sxen_port + (int)r.domid + g.fd + (int)ioc[2];
}
#ifdef XENSOCK_TEST_CORRUPT
#error "a lab knob in the public header"
#endif
#ifdef XENSOCK_COPY_ROUTINE
#error "a lab knob in the public header"
#endif
"#;
    for (file, compiler, std) in [
        ("h.c", cc(), "-std=c89"),
        (
            "h.cc",
            std::env::var("CXX").unwrap_or_else(|_| "c++".into()),
            "-std=c++11",
        ),
    ] {
        let path = dir.join(file);
        std::fs::write(&path, src).unwrap();
        let o = Command::new(&compiler)
            .args([
                std,
                "-pedantic-errors",
                "-Wall",
                "-Werror",
                "-fsyntax-only",
                "-I",
            ])
            .arg(include_dir())
            .arg(&path)
            .output()
            .unwrap_or_else(|e| panic!("running {compiler}: {e}"));
        assert!(
            o.status.success(),
            "{compiler} {std}:\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // the value the module answers (socket/ioctl.rs IOC_LOCAL_DOMID)
    let probe = dir.join("ioc.c");
    std::fs::write(
        &probe,
        "#include <stdio.h>\n#include \"xensock.h\"\nint main(void){printf(\"%#lx\", (unsigned long)XENSOCK_IOC_LOCAL_DOMID);return 0;}\n",
    )
    .unwrap();
    let exe = dir.join("ioc");
    compile(&probe, &exe, &[]);
    let out = Command::new(&exe).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "0x80045812");
    std::fs::remove_dir_all(&dir).unwrap();
}
