// Package apicheck holds tests that look at dlxbridge the way another module
// does: the exported API of every public package may not mention a type (or
// document an error) that lives under internal/, and the library example in
// examples/library, a module of its own, must build and run. It has no code.
package apicheck
