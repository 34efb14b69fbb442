package main

import (
	"net"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/plughost/plughost/host/config"
	"github.com/plughost/plughost/host/ingress"
	"github.com/plughost/plughost/host/metrics"
)

// The admin listener's caps and timeouts: its own small allowance, so
// that /metrics and the admin API keep answering when the ingress is at
// max_conns, of which one client (keyed as for max_conns_per_ip) may
// hold only adminMaxConnsPerIP, and a connection that sends no request
// head within adminReadHeaderTimeout, or stays idle between requests for
// adminIdleTimeout, is closed: whoever can reach the admin port cannot
// fill it with idle connections from one address, nor hold them for long
// from several. A scraper needs one connection.
const (
	adminMaxConns          = 64
	adminMaxConnsPerIP     = 8
	adminReadHeaderTimeout = 5 * time.Second
	adminIdleTimeout       = 10 * time.Second
)

// fdReserve is how many file descriptors max_conns leaves for everything
// but ingress connections: the admin listener's, each plugin's control
// and data-plane sockets and pipes, refused connections being answered,
// and files.
const fdReserve = 1024

// limitListeners caps the ingress listener at limits.max_conns (lowered to
// what the file descriptor limit allows) and max_conns_per_ip (when the
// file leaves it at its default, a quarter of the lowered max_conns), and
// the admin listener at adminMaxConns and adminMaxConnsPerIP. It logs the
// descriptor limit, which Go has already raised from the soft limit to
// the hard one at start (the syscall package does so on every Unix since
// Go 1.19).
func limitListeners(logger hclog.Logger, m *metrics.Host, cfg *config.Config, ln, adminLn net.Listener) (net.Listener, net.Listener) {
	maxConns, perIP := cfg.Limits.MaxConns, cfg.Limits.MaxConnsPerIP
	soft, hard, err := fdLimit()
	if err != nil {
		logger.Warn("cannot read the file descriptor limit", "error", err)
	} else {
		m.Conns.FDLimit.WithLabelValues("soft").Set(float64(soft))
		m.Conns.FDLimit.WithLabelValues("hard").Set(float64(hard))
		maxConns, perIP = fitConns(cfg.Limits, connRoom(soft))
		if maxConns < cfg.Limits.MaxConns {
			logger.Warn("max_conns exceeds what the file descriptor limit allows; lowering it",
				"max_conns", cfg.Limits.MaxConns, "lowered_to", maxConns, "fd_soft_limit", soft, "fd_hard_limit", hard)
		}
		logger.Info("file descriptor limit", "soft", soft, "hard", hard, "max_conns", maxConns, "max_conns_per_ip", perIP)
	}
	ln = ingress.NewListener(ln, ingress.ListenerOptions{
		Name: "ingress", MaxConns: maxConns, MaxConnsPerIP: perIP, Metrics: m.Conns,
	})
	adminLn = ingress.NewListener(adminLn, ingress.ListenerOptions{
		Name: "admin", MaxConns: adminMaxConns, MaxConnsPerIP: adminMaxConnsPerIP, Metrics: m.Conns,
		OwnAnswers: true,
	})
	return ln, adminLn
}

// fitConns returns l's max_conns and max_conns_per_ip for a listener with
// room for room connections: max_conns at most room, and a defaulted
// max_conns_per_ip a quarter of that.
func fitConns(l config.Limits, room uint64) (maxConns, perIP int) {
	maxConns, perIP = l.MaxConns, l.MaxConnsPerIP
	if uint64(maxConns) > room {
		maxConns = int(room)
		if l.MaxConnsPerIPDefault {
			perIP = config.DefaultMaxConnsPerIP(maxConns)
		}
	}
	return maxConns, perIP
}

// connRoom is how many ingress connections a soft descriptor limit
// leaves room for: all but fdReserve, and at least half of it.
func connRoom(soft uint64) uint64 {
	if soft > 2*fdReserve {
		return soft - fdReserve
	}
	return max(soft/2, 1)
}
