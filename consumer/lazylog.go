package consumer

import (
	"context"
	"log/slog"
	"slices"
)

// deferAttrs is a slog.Handler that keeps Logger.With's attributes as a list
// and hands them to its handler only when a record is written. slog's own
// handlers format With's attributes at once, and the runtime makes a logger
// with the message's attributes for every failed delivery (buildCopy)
// whether or not its level lets any line through: in a storm, with the
// level at Warn or Error, that was formatting for nothing on every retry.
// Values are resolved when a line is written rather than at With.
type deferAttrs struct {
	h     slog.Handler
	attrs []slog.Attr
}

func (d *deferAttrs) Enabled(ctx context.Context, l slog.Level) bool { return d.h.Enabled(ctx, l) }

func (d *deferAttrs) Handle(ctx context.Context, r slog.Record) error {
	return d.resolved().Handle(ctx, r)
}

func (d *deferAttrs) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return d
	}
	return &deferAttrs{h: d.h, attrs: append(slices.Clip(d.attrs), attrs...)}
}

func (d *deferAttrs) WithGroup(name string) slog.Handler {
	if name == "" {
		return d
	}
	return &deferAttrs{h: d.resolved().WithGroup(name)}
}

// resolved is the handler with the kept attributes applied.
func (d *deferAttrs) resolved() slog.Handler {
	if len(d.attrs) == 0 {
		return d.h
	}
	return d.h.WithAttrs(d.attrs)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
