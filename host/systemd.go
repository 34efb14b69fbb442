package main

import (
	"os"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/hashicorp/go-hclog"
)

// readyPoll is how often the notifier checks the host's readiness while
// it waits to send READY=1; the check reads the ingress's routing table
// and each plugin's status, and runs only while it waits.
const readyPoll = 50 * time.Millisecond

// notifyEvent is a change of the host's lifecycle that systemd hears of.
type notifyEvent int

const (
	eventReloading notifyEvent = iota // a SIGHUP reload begins
	eventReloaded                     // it ended, whatever its outcome
	eventStopping                     // the drain begins
)

// notifier tells systemd about the host's lifecycle over the sd_notify
// protocol (sd_notify(3)), when the host runs under a unit of Type=notify
// (NOTIFY_SOCKET is set):
//
//  1. READY=1 once every required plugin is ready (ready reports /readyz's
//     answer), not merely once the listeners are open, so that units
//     ordered After= this one start against a host that serves;
//  2. around a SIGHUP reload, RELOADING=1 with MONOTONIC_USEC (which
//     Type=notify-reload requires, from systemd 253) as it begins, then
//     READY=1 once it has ended and the required plugins are ready again;
//  3. STOPPING=1 as the drain begins; no READY=1 after it;
//  4. WATCHDOG=1 every half of WATCHDOG_USEC when systemd set it
//     (WatchdogSec=) for this process (WATCHDOG_PID), from start to exit
//     (systemd disarms the watchdog once the unit stops, so the pings
//     during the drain are ignored). They come from the notifier's own
//     goroutine: a host too wedged to schedule it is restarted.
//
// Every message is sent by one goroutine, so they reach systemd in the
// order of the events. Its methods do nothing on a nil notifier, which is
// what startNotifier returns outside systemd. Call close when the host
// exits.
type notifier struct {
	logger   hclog.Logger
	ready    func() bool
	watchdog time.Duration
	// events is read by run; senders give up once close is called. Reloads
	// run one at a time, so a reload's two events and the one stopping
	// event never fill it.
	events chan notifyEvent
	quit   chan struct{} // closed by close
	done   chan struct{} // closed when run returns
}

// startNotifier starts the notifier when NOTIFY_SOCKET is set and returns
// nil otherwise.
func startNotifier(logger hclog.Logger, ready func() bool) *notifier {
	if os.Getenv("NOTIFY_SOCKET") == "" {
		return nil
	}
	logger = logger.Named("systemd")
	watchdog, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		logger.Warn("ignoring the watchdog settings systemd passed", "error", err)
		watchdog = 0
	}
	n := &notifier{
		logger:   logger,
		ready:    ready,
		watchdog: watchdog,
		events:   make(chan notifyEvent, 4),
		quit:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	go n.run()
	return n
}

// reloading tells systemd that a reload begins.
func (n *notifier) reloading() { n.post(eventReloading) }

// reloaded tells systemd, once the required plugins are ready, that the
// reload has ended.
func (n *notifier) reloaded() { n.post(eventReloaded) }

// stopping tells systemd that the drain begins.
func (n *notifier) stopping() { n.post(eventStopping) }

// close stops the notifier and waits for it.
func (n *notifier) close() {
	if n == nil {
		return
	}
	close(n.quit)
	<-n.done
}

func (n *notifier) post(ev notifyEvent) {
	if n == nil {
		return
	}
	select {
	case n.events <- ev:
	case <-n.quit:
	}
}

func (n *notifier) run() {
	defer close(n.done)
	var watchdog <-chan time.Time
	if n.watchdog > 0 {
		n.logger.Debug("sending watchdog keep-alives", "interval", n.watchdog/2)
		t := time.NewTicker(n.watchdog / 2)
		defer t.Stop()
		watchdog = t.C
		n.send(daemon.SdNotifyWatchdog)
	}
	waiting, stopping := true, false
	for {
		var poll <-chan time.Time
		if waiting && !stopping {
			if n.ready() {
				n.send(daemon.SdNotifyReady)
				n.logger.Info("told systemd the host is ready")
				waiting = false
			} else {
				poll = time.After(readyPoll)
			}
		}
		select {
		case <-n.quit:
			return
		case <-watchdog:
			n.send(daemon.SdNotifyWatchdog)
		case <-poll:
		case ev := <-n.events:
			switch ev {
			case eventReloading:
				if !stopping {
					n.send(daemon.SdNotifyReloading + "\n" + daemon.SdNotifyMonotonicUsec())
				}
				waiting = false
			case eventReloaded:
				waiting = true
			case eventStopping:
				if !stopping {
					n.send(daemon.SdNotifyStopping)
				}
				stopping = true
			}
		}
	}
}

// send sends one message. A failure is logged and not retried: the
// protocol has no acknowledgement, and systemd acts on a missing READY=1
// or WATCHDOG=1 by its own timeouts.
func (n *notifier) send(state string) {
	if _, err := daemon.SdNotify(false, state); err != nil {
		n.logger.Warn("could not notify systemd", "state", state, "error", err)
	}
}
