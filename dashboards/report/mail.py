"""The report as e-mail: HTML body with the plain-text summary as its alternative and the PDF
attached; sent over SMTP with optional implicit TLS or STARTTLS and AUTH ([report.smtp]).
"""

from __future__ import annotations

import logging
import smtplib
import ssl
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from typing import Iterable, Sequence

from gpufleet.report.config import Smtp

log = logging.getLogger(__name__)


class MailError(Exception):
    """Sending failed; the message names the server and the reason."""


def message(*, sender: str, to: Sequence[str], subject: str, text: str, html: str | None = None,
            pdf: bytes | None = None, pdf_name: str = "report.pdf") -> EmailMessage:
    """multipart/mixed [ multipart/alternative [text/plain, text/html], application/pdf ]."""
    msg = EmailMessage()
    msg["Subject"] = subject
    msg["From"] = sender
    msg["To"] = ", ".join(to)
    msg["Date"] = formatdate(localtime=False, usegmt=True)
    msg["Message-ID"] = make_msgid(domain=sender.rsplit("@", 1)[-1] or "gpufleet")
    msg["Auto-Submitted"] = "auto-generated"
    msg.set_content(text, subtype="plain", charset="utf-8")
    if html is not None:
        msg.add_alternative(html, subtype="html", charset="utf-8")
    if pdf is not None:
        msg.add_attachment(pdf, maintype="application", subtype="pdf", filename=pdf_name)
    return msg


def send(messages: Iterable[EmailMessage], smtp: Smtp) -> int:
    """Send over one connection; returns how many went. Raises MailError."""
    messages = list(messages)
    if not messages:
        return 0
    where = f"SMTP {smtp.host}:{smtp.port}"
    password = smtp.password()  # ConfigError if the file cannot be read
    try:
        context = ssl.create_default_context(cafile=smtp.ca_file or None)
        client = (smtplib.SMTP_SSL(smtp.host, smtp.port, timeout=smtp.timeout, context=context) if smtp.ssl
                  else smtplib.SMTP(smtp.host, smtp.port, timeout=smtp.timeout))
        with client:
            client.ehlo()
            if smtp.starttls:
                client.starttls(context=context)
                client.ehlo()
            if smtp.username:
                client.login(smtp.username, password or "")
            sent = 0
            for msg in messages:
                to = [a.strip() for a in msg["To"].split(",") if a.strip()]
                refused = client.send_message(msg, to_addrs=to)
                if refused:
                    log.warning("%s refused recipients of %r: %s", where, msg["Subject"], ", ".join(refused))
                sent += 1
                log.info("mailed %r to %s", msg["Subject"], ", ".join(to))
            return sent
    except smtplib.SMTPAuthenticationError as e:
        raise MailError(f"{where}: authentication as {smtp.username!r} failed: {e.smtp_code} {e.smtp_error!r}") from None
    except smtplib.SMTPNotSupportedError as e:
        raise MailError(f"{where}: {e} (starttls = {smtp.starttls}, username = {smtp.username!r})") from None
    except (smtplib.SMTPException, OSError, ssl.SSLError) as e:
        raise MailError(f"{where}: {type(e).__name__}: {e}") from None
