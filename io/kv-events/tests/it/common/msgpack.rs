//! Just enough msgpack to write KV-event batches the way engines do.

pub enum Mp {
    Nil,
    Uint(u64),
    Float(f64),
    Str(String),
    Array(Vec<Mp>),
    Map(Vec<(&'static str, Mp)>),
}

pub fn s(text: &str) -> Mp {
    Mp::Str(text.to_owned())
}

impl Mp {
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Mp::Nil => out.push(0xc0),
            Mp::Uint(v) if *v < 128 => out.push(*v as u8),
            Mp::Uint(v) => {
                out.push(0xcf);
                out.extend_from_slice(&v.to_be_bytes());
            }
            Mp::Float(v) => {
                out.push(0xcb);
                out.extend_from_slice(&v.to_be_bytes());
            }
            Mp::Str(text) => {
                header(out, text.len(), 0xa0, 32, 0xda);
                out.extend_from_slice(text.as_bytes());
            }
            Mp::Array(items) => {
                header(out, items.len(), 0x90, 16, 0xdc);
                items.iter().for_each(|item| item.encode(out));
            }
            Mp::Map(entries) => {
                header(out, entries.len(), 0x80, 16, 0xde);
                for (key, value) in entries {
                    s(key).encode(out);
                    value.encode(out);
                }
            }
        }
    }
}

/// A fix-size header below `fix_limit`, else the 16-bit form.
fn header(out: &mut Vec<u8>, len: usize, fix: u8, fix_limit: usize, marker16: u8) {
    if len < fix_limit {
        out.push(fix | len as u8);
    } else {
        out.push(marker16);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    }
}
