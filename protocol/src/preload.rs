//! `preload`: the modules a Python command stage's zygote imports before forking it, written
//! out (`["torch", "transformers"]`) or learned (`"auto"`).

use schemars::JsonSchema;
use serde::de::{self, Deserializer, SeqAccess};
use serde::{Deserialize, Serialize, Serializer};
use std::fmt;

/// What a zygote starts from. Either way it learns: the modules that stages forked from it
/// imported themselves are imported by its next generation (docs/zygote.md).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Preload {
    /// `"auto"`: nothing beyond the interpreter; the zygote learns from its stages.
    Auto,
    /// These modules (`[]`: no zygote, the stage is exec'd).
    Modules(Vec<String>),
}

impl Default for Preload {
    fn default() -> Self {
        Preload::Modules(Vec::new())
    }
}

impl Preload {
    /// `[]`: the stage is exec'd, no zygote.
    pub fn is_off(&self) -> bool {
        matches!(self, Preload::Modules(m) if m.is_empty())
    }

    /// The modules written out (none for `"auto"`).
    pub fn modules(&self) -> &[String] {
        match self {
            Preload::Auto => &[],
            Preload::Modules(m) => m,
        }
    }
}

impl Serialize for Preload {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Preload::Auto => s.serialize_str("auto"),
            Preload::Modules(m) => m.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Preload {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> de::Visitor<'de> for Visitor {
            type Value = Preload;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of module names, or \"auto\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Preload, E> {
                match v {
                    "auto" => Ok(Preload::Auto),
                    other => Err(E::custom(format!(
                        "`preload` is a list of module names or \"auto\", not {other:?} (write [{other:?}] for one module)"
                    ))),
                }
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Preload, A::Error> {
                let mut modules = Vec::new();
                while let Some(name) = seq.next_element::<String>()? {
                    modules.push(name);
                }
                Ok(Preload::Modules(modules))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// The schema's view of [`Preload`].
#[derive(JsonSchema)]
#[allow(dead_code)]
#[serde(untagged)]
enum PreloadForm {
    /// `"auto"`: learn the modules from the stages.
    Auto(AutoWord),
    /// Module names.
    Modules(Vec<String>),
}

#[derive(JsonSchema)]
#[allow(dead_code)]
enum AutoWord {
    #[serde(rename = "auto")]
    Auto,
}

impl JsonSchema for Preload {
    fn schema_name() -> String {
        "Preload".into()
    }

    fn json_schema(gen: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
        PreloadForm::json_schema(gen)
    }
}

#[cfg(test)]
mod tests {
    use super::Preload;

    #[test]
    fn a_list_or_auto() {
        let list: Preload = serde_json::from_str(r#"["torch","transformers"]"#).unwrap();
        assert_eq!(list.modules(), ["torch", "transformers"]);
        assert_eq!(
            serde_json::to_string(&list).unwrap(),
            r#"["torch","transformers"]"#
        );
        let auto: Preload = serde_json::from_str(r#""auto""#).unwrap();
        assert_eq!(auto, Preload::Auto);
        assert_eq!(serde_json::to_string(&auto).unwrap(), r#""auto""#);
        assert!(!auto.is_off());
        assert!(serde_json::from_str::<Preload>("[]").unwrap().is_off());
        let wrong = serde_json::from_str::<Preload>(r#""torch""#).unwrap_err();
        assert!(wrong.to_string().contains("not \"torch\""), "{wrong}");
    }
}
